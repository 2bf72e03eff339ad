"""Training a block drafter on the target's rows: teacher-forced blocks at random anchors, best checkpoint kept.

For an anchor at position `a` the block's draft row `e` (1..bs-1) must say the
target's greedy token after `a + e - 1`, and it only counts while the sequence
followed the target greedily from `a` on (always, in self-generated text; in a
corpus, where the text and the target agree). The loss is cross-entropy over the
FR prefix of the vocabulary (labels past it cannot be drafted and are left
out), weighted `decay ** (e - 1)`: an early position gates every later one.

Acceptance is measured on held-back sequences exactly as verification counts it:
a block's drafts are accepted up to the first one that differs from the target
(and, for DSpark, up to the first row under the confidence threshold). Its
Markov head is fed the target's tokens (teacher forcing), which up to the first
miss are the drafts it would chain at inference, so the count is exact.

Deterministic under the seed for a given number of steps; `deadline` stops the
loop between steps, and the best checkpoint (by mean accepted length) is kept.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from power.artifacts.atomic import atomic_path
from power.artifacts.contracts import DSPARK, DrafterHparams

from .generate import NO_LABEL, Example
from .model import BlockDrafterNet


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    max_steps: int = 100_000
    sequences_per_step: int = 4
    anchors_per_sequence: int = 8
    learning_rate: float = 2e-3
    warmup_steps: int = 30
    position_decay: float = 0.8
    eval_every: int = 50
    confidence_weight: float = 0.2


@dataclass
class Curve:
    """Acceptance on the held-back blocks: per draft position, conditional on the positions before it."""

    reached: list[int] = field(default_factory=list)  # blocks whose drafts 1..e-1 were all accepted
    accepted: list[int] = field(default_factory=list)  # ... and whose draft e was accepted too
    blocks: int = 0

    @classmethod
    def empty(cls, positions: int) -> Curve:
        return cls([0] * positions, [0] * positions, 0)

    def add(self, accepted_length: torch.Tensor) -> None:
        for e in range(len(self.reached)):
            self.reached[e] += int((accepted_length >= e).sum())
            self.accepted[e] += int((accepted_length > e).sum())
        self.blocks += len(accepted_length)

    def per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached, strict=True)]

    def mean_accepted(self, k: int) -> float:
        """Mean accepted drafts per block at width k."""
        return sum(self.accepted[:k]) / self.blocks if self.blocks else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "per_position": [round(p, 4) for p in self.per_position()],
                "mean_accepted": {str(k): round(self.mean_accepted(k), 4) for k in range(1, len(self.reached) + 1)}}


def block_targets(example: Example, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """labels [A, bs-1] for the draft rows of each anchor's block, and whether each one counts."""
    tokens, labels = example.tokens, example.labels
    length = len(tokens)
    offsets = torch.arange(1, block_size)
    where = anchors[:, None] + offsets[None] - 1  # the row whose argmax draft e must equal
    inside = where < length
    safe = where.clamp(max=length - 1)
    target = labels[safe]
    agrees = torch.ones(length, dtype=torch.bool)  # position t followed the target's choice after t - 1
    agrees[1:] = tokens[1:] == labels[:-1]
    followed = agrees[safe] | (offsets[None] == 1)  # draft e needs the text at a + e - 1 to be the target's own
    valid = (inside & followed & (target != NO_LABEL)).cummin(dim=1).values
    return target, valid


def anchor_positions(example: Example) -> torch.Tensor:
    """Positions with a target label: every anchor whose first draft has something to match."""
    return torch.nonzero(example.labels != NO_LABEL).flatten()


class Trainer:
    def __init__(self, net: BlockDrafterNet, settings: TrainSettings, train: Sequence[Example],
                 held: Sequence[Example], k: int) -> None:
        self.net, self.settings, self.train_set, self.held, self.k = net, settings, list(train), list(held), k
        self.hp: DrafterHparams = net.hp
        self.fr = net.head.shape[0]
        self.optimizer = torch.optim.AdamW(net.parameters(), lr=settings.learning_rate, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.step = 0
        self.best: dict[str, Any] = {"score": -1.0, "step": 0, "curve": None, "state": None}
        self.trained_s = 0.0

    # --- checkpoint ----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "generator": self.generator.get_state(), "best": self.best, "trained_s": self.trained_s,
                "settings": asdict(self.settings)}

    def save(self, path: Path) -> None:
        with atomic_path(path) as temp:
            torch.save(self.state(), temp)

    def load(self, path: Path) -> None:
        state = torch.load(path, weights_only=False)
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.best, self.trained_s = state["step"], state["best"], state["trained_s"]
        self.generator.set_state(state["generator"])

    # --- the loop -------------------------------------------------------------------
    def run(self, deadline: float | None, checkpoint: Path | None, progress: bool = True) -> dict[str, Any]:
        s = self.settings
        bar = tqdm(total=s.max_steps, initial=self.step, desc="train", unit="step", disable=not progress)
        while self.step < s.max_steps and (deadline is None or time.monotonic() < deadline):
            started = time.monotonic()
            loss = self._train_step()
            self.step += 1
            self.trained_s += time.monotonic() - started
            if self.step % s.eval_every == 0 or self.step == s.max_steps:
                self._evaluate()
                if checkpoint is not None:
                    self.save(checkpoint)
            bar.update()
            bar.set_postfix(loss=f"{loss:.3f}", best=f"{max(self.best['score'], 0.0):.2f}")
        bar.close()
        if self.best["state"] is None or self.step % s.eval_every:
            self._evaluate()
            if checkpoint is not None:
                self.save(checkpoint)
        return self.best

    def _train_step(self) -> float:
        s = self.settings
        lr = s.learning_rate * min(1.0, (self.step + 1) / s.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        picks = torch.randint(len(self.train_set), (s.sequences_per_step,), generator=self.generator)
        self.optimizer.zero_grad()
        total = 0.0
        for index in picks.tolist():
            example = self.train_set[index]
            candidates = anchor_positions(example)
            chosen = candidates[torch.randperm(len(candidates), generator=self.generator)[:s.anchors_per_sequence]]
            loss = self._loss(example, chosen.sort().values) / s.sequences_per_step
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.optimizer.step()
        return total

    def _loss(self, example: Example, anchors: torch.Tensor) -> torch.Tensor:
        target, valid = block_targets(example, anchors, self.hp.block_size)
        valid = valid & (target < self.fr)
        rows = self.net.rows(example.features.float(), example.tokens, anchors)[:, 1:]  # [A, bs-1, d]
        weights = self.settings.position_decay ** torch.arange(self.hp.block_size - 1, dtype=torch.float32)
        weights = weights[None].expand_as(target)[valid]
        if self.net.kind == DSPARK:
            marked = self.net.markov(rows, _predecessors(example, anchors, target))
            logits = self.net.markov_logits(marked[valid])
            right = (logits.argmax(-1) == target[valid]).float()
            confidence = F.binary_cross_entropy_with_logits(self.net.confidence_logit(marked[valid]), right)
            return _weighted_ce(logits, target[valid], weights) + self.settings.confidence_weight * confidence
        return _weighted_ce(rows[valid] @ self.net.head.T, target[valid], weights)

    # --- acceptance -----------------------------------------------------------------
    @torch.no_grad()
    def curve(self, examples: Sequence[Example] | None = None) -> Curve:
        curve = Curve.empty(self.hp.block_size - 1)
        for example in examples if examples is not None else self.held:
            anchors = anchor_positions(example)
            target, valid = block_targets(example, anchors, self.hp.block_size)
            whole = valid.all(dim=1)  # blocks the text can score to the end
            if not whole.any():
                continue
            anchors, target = anchors[whole], target[whole]
            rows = self.net.rows(example.features.float(), example.tokens, anchors)[:, 1:]
            if self.net.kind == DSPARK:
                marked = self.net.markov(rows, _predecessors(example, anchors, target))
                hit = self.net.markov_logits(marked).argmax(-1) == target
                sure = torch.sigmoid(self.net.confidence_logit(marked)) >= (self.hp.confidence_threshold or 0.0)
                hit = hit & sure
            else:
                hit = (rows @ self.net.head.T).argmax(-1) == target
            curve.add(hit.int().cummin(dim=1).values.sum(dim=1))
        return curve

    def _evaluate(self) -> None:
        curve = self.curve()
        score = curve.mean_accepted(self.k)
        if score > self.best["score"]:
            self.best = {"score": score, "step": self.step, "curve": curve.to_json(),
                         "state": {k: v.clone() for k, v in self.net.state_dict().items()}}


def _predecessors(example: Example, anchors: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DSpark's Markov predecessor per draft row: the anchor, then the target's token at the row before."""
    first = example.tokens[anchors][:, None]
    return torch.cat((first, target[:, :-1].clamp(min=0)), dim=1)


def _weighted_ce(logits: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    if not len(target):
        return logits.sum() * 0.0
    return (F.cross_entropy(logits, target, reduction="none") * weights).sum() / weights.sum()
