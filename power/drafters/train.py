"""Training a drafter on the target's rows: an objective's loss over random sequences, the best checkpoint kept.

An objective (`BlockObjective` in `power.drafters.model`, `ChainObjective` in
`power.drafters.mtp_head`) owns the module, its loss on one sequence, and the
accepted length of every draft round a held-back sequence can score, counted as
verification counts it: drafts accepted up to the first that differs from the
target. The trainer owns the rest: AdamW with warm-up and gradient clipping,
acceptance measured on the held-back sequences every `eval_every` steps, the
best state (by mean accepted length at K) kept, checkpoints to resume from.

Deterministic under the seed for a given number of steps; the budget
(`power.drafters.budget`) stops the loop between steps, before a step that
would not fit.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from power.kernels.cpu.build import cpu_flags

from .budget import Budget, Clock
from .generate import NOT_SCORED, Example
from .model import GGUFTensors
from .progress import BudgetBar

PRECISIONS = ("auto", "float32", "bfloat16")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # a CPU that multiplies bfloat16 natively (oneDNN's bf16 GEMM)
RECENT_STEPS = 3  # the next step is charged as the slowest of the last three: a host that slows is seen at once


def training_precision(requested: str = "auto", flags: frozenset[str] | None = None) -> str:
    """The precision training's products run in: `requested`, or with auto bfloat16 where the CPU multiplies it
    natively (on 2 cores of an AMD EPYC with AVX512-BF16 a [2000, 640] x [640, 4096] product ran 7x faster than in
    float32), else float32. Weights, optimiser state and the acceptance measurement stay float32."""
    if requested not in PRECISIONS:
        raise ValueError(f"training precision {requested!r}: choose {', '.join(PRECISIONS)}")
    if requested != "auto":
        return requested
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(flag in flags for flag in BF16_CPU_FLAGS) else "float32"


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    max_steps: int = 100_000
    sequences_per_step: int = 4
    learning_rate: float = 2e-3
    warmup_steps: int = 30
    eval_every: int = 50
    precision: str = "float32"  # of the forward's products (torch.autocast); `training_precision` chooses


class Objective(Protocol):
    """What a drafter kind trains on."""

    @property
    def net(self) -> GGUFTensors: ...

    @property
    def positions(self) -> int:
        """Draft positions the acceptance curve counts."""

    def loss(self, example: Example, generator: torch.Generator) -> torch.Tensor:
        """The loss on one sequence (`generator`: any random choice it makes, so a run is deterministic)."""

    def accepted(self, example: Example) -> torch.Tensor:
        """Accepted drafts [T] of a round anchored at each position of the held-back sequence, NOT_SCORED where the
        text cannot score one to the end."""


@dataclass
class Positions:
    """Rounds' accepted drafts counted per draft position, conditional on the positions before it."""

    reached: list[int]  # rounds whose drafts 1..e-1 were all accepted
    accepted: list[int]  # ... and whose draft e was accepted too
    rounds: int = 0

    @classmethod
    def empty(cls, positions: int) -> Positions:
        return cls([0] * positions, [0] * positions)

    def add(self, accepted_length: torch.Tensor) -> None:
        for e in range(len(self.reached)):
            self.reached[e] += int((accepted_length >= e).sum())
            self.accepted[e] += int((accepted_length > e).sum())
        self.rounds += len(accepted_length)

    def per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached, strict=True)]

    def mean_accepted(self, k: int) -> float:
        """Mean accepted drafts per round at width k."""
        return sum(self.accepted[:k]) / self.rounds if self.rounds else 0.0

    def tokens_per_round(self, k: int) -> float:
        """1 + sum_{j<=k} prod_{i<=j} acc_i, acc_i the share of the rounds whose drafts 1..i-1 were all right that
        get draft i right too. Over the rounds counted the product telescopes to the share of rounds that accept j
        drafts or more, so this is 1 + `mean_accepted(k)`: the formula, not an independence assumption."""
        total, reaching = 1.0, 1.0
        for accuracy in self.per_position()[:k]:
            reaching *= accuracy
            total += reaching
        return total


def laid_rounds(accepted: torch.Tensor, first: int, k: int) -> torch.Tensor:
    """The rounds serving lays at width k over one sequence, as `power.drafters.served` replays them: the first
    anchored at position `first`, each accepting min(accepted[anchor], k) drafts and the next anchored after those and
    the target's own token (`accepted` [T]: the drafts a round anchored at each position accepts, NOT_SCORED where the
    text cannot score one: such an anchor is stepped over)."""
    rounds, anchor, at = [], first, accepted.tolist()
    while anchor < len(at):
        if at[anchor] == NOT_SCORED:
            anchor += 1
            continue
        rounds.append(min(at[anchor], k))
        anchor += rounds[-1] + 1
    return torch.tensor(rounds, dtype=torch.long)


@dataclass
class Curve:
    """Acceptance on held-back text: per draft position over every anchor (each one a round), and per width K over
    the rounds serving lays (`laid_rounds`), whose tokens per round is the acceptance estimate."""

    anchors: Positions
    laid: dict[int, Positions]

    @classmethod
    def empty(cls, positions: int) -> Curve:
        return cls(Positions.empty(positions), {k: Positions.empty(k) for k in range(1, positions + 1)})

    def add(self, accepted: torch.Tensor, first: int) -> None:
        """One sequence's accepted drafts per anchor position (`Objective.accepted`), serving's first round at
        `first`."""
        self.anchors.add(accepted[accepted != NOT_SCORED])
        for k, counts in self.laid.items():
            counts.add(laid_rounds(accepted, first, k))

    def per_position(self) -> list[float]:
        return self.anchors.per_position()

    def mean_accepted(self, k: int) -> float:
        """Mean accepted drafts per anchor at width k."""
        return self.anchors.mean_accepted(k)

    def estimate(self, k: int) -> float:
        """Tokens a round of width k commits, from the per-position accuracies over the rounds serving lays at k.
        Every anchor's mean usually runs above it: a stretch the drafter gets right counts once per position in it,
        where serving crosses it in a few long rounds."""
        return self.laid[k].tokens_per_round(k)

    def to_json(self) -> dict[str, Any]:
        widths = range(1, len(self.anchors.reached) + 1)
        return {"blocks": self.anchors.rounds, "per_position": [round(p, 4) for p in self.per_position()],
                "mean_accepted": {str(k): round(self.mean_accepted(k), 4) for k in widths},
                "estimate": {str(k): round(self.estimate(k), 4) for k in widths},
                "estimate_rounds": {str(k): self.laid[k].rounds for k in widths}}


class Trainer:
    def __init__(self, objective: Objective, settings: TrainSettings, train: Sequence[Example],
                 held: Sequence[Example], k: int) -> None:
        self.objective, self.settings, self.train_set, self.held, self.k = (
            objective,
            settings,
            list(train),
            list(held),
            k,
        )
        self.net = objective.net
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=settings.learning_rate, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.step = 0
        self.resumed_from = 0  # the step a checkpoint restored
        self.best: dict[str, Any] = {"score": -1.0, "step": 0, "curve": None, "state": None}
        self.trained_s = 0.0
        self._eval_s = 0.0
        self._checkpoint_s = 0.0
        self._sequence_s = 0.0  # one training sequence's forward and backward
        self.estimate = 0.0  # the last evaluation's tokens per round at K (`Curve.estimate`)

    # --- checkpoint ----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "generator": self.generator.get_state(), "best": self.best, "trained_s": self.trained_s,
                "settings": asdict(self.settings)}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from `state()`'s table."""
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.best, self.trained_s = state["step"], state["best"], state["trained_s"]
        self.resumed_from = self.step
        self.generator.set_state(state["generator"])

    # --- the loop -------------------------------------------------------------------
    def run(self, budget: Budget | None, checkpoint: Callable[[dict[str, Any]], None] | None,
            progress: bool = True, reserve: Callable[[float], float] | None = None) -> dict[str, Any]:
        """Train until `max_steps` or until the next step would not fit in `budget` beside what must follow it: the
        evaluation and checkpoint it ends on (every `eval_every` steps), this loop's last evaluation and checkpoint,
        and the caller's `reserve(evaluation_s)` seconds (given one held-back evaluation's). Each cost is measured:
        an evaluation, a checkpoint and a sequence's forward and backward by `measure_costs` before the first step,
        then the slowest of the last RECENT_STEPS steps; `checkpoint` is given `state()` after every evaluation."""
        s = self.settings
        clock = time.monotonic if budget is None else budget.clock
        recent: deque[float] = deque(maxlen=RECENT_STEPS)
        bar = BudgetBar("train", None if budget is None else budget.deadline - self._following_s(reserve),
                        s.max_steps, "step", progress, initial=self.step)
        while self.step < s.max_steps and (budget is None
                                           or budget.fits(self.next_step_s(recent) + self._following_s(reserve))):
            started = clock()
            loss = self._train_step()
            self.step += 1
            step_s = clock() - started
            recent.append(step_s)
            self.trained_s += step_s
            if self.step % s.eval_every == 0 or self.step == s.max_steps:
                self._evaluate(clock)
                self._checkpoint(checkpoint, clock)
            bar.advance(step=self.step, loss=f"{loss:.3f}", best=f"{max(self.best['score'], 0.0):.2f}",
                        estimate=f"{self.estimate:.2f} tok/round at K{self.k}")
        bar.close()
        if self.best["state"] is None or self.step % s.eval_every:
            self._evaluate(clock)
            self._checkpoint(checkpoint, clock)
        return self.best

    def next_step_s(self, recent: Sequence[float]) -> float:
        """What the next step costs: the slowest of `recent` steps (before any, its sequences at the measured
        sequence's cost), with the evaluation and checkpoint it ends on when it is an evaluation step."""
        s = self.settings
        step_s = max(recent) if recent else self._sequence_s * s.sequences_per_step
        return step_s + (self.closing_s if (self.step + 1) % s.eval_every == 0 else 0.0)

    def _following_s(self, reserve: Callable[[float], float] | None) -> float:
        """What must still fit after the next step: this loop's last evaluation and checkpoint, and the caller's."""
        return self.closing_s + (reserve(self._eval_s) if reserve is not None else 0.0)

    @property
    def eval_s(self) -> float:
        """The last held-back evaluation's seconds."""
        return self._eval_s

    @property
    def closing_s(self) -> float:
        """What an evaluation step adds to a step: the evaluation and the checkpoint after it."""
        return self._eval_s + self._checkpoint_s

    def measure_costs(self, checkpoint: Callable[[dict[str, Any]], None] | None, clock: Clock) -> None:
        """What the budget's decisions charge, measured before the first step: one held-back evaluation, one
        checkpoint (of the state training starts from: a rerun resumes from it as from a fresh start), and one
        training sequence's forward and backward (its gradients dropped: the state is untouched)."""
        started = clock()
        self.curve()
        self._eval_s = clock() - started
        self._checkpoint(checkpoint, clock)
        started = clock()
        with self._autocast():
            loss = self.objective.loss(self.train_set[0], torch.Generator().manual_seed(0))
        loss.backward()
        self.optimizer.zero_grad()
        self._sequence_s = clock() - started

    def _checkpoint(self, checkpoint: Callable[[dict[str, Any]], None] | None, clock: Clock) -> None:
        if checkpoint is not None:
            started = clock()
            checkpoint(self.state())
            self._checkpoint_s = clock() - started

    def _train_step(self) -> float:
        s = self.settings
        lr = s.learning_rate * min(1.0, (self.step + 1) / s.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        picks = torch.randint(len(self.train_set), (s.sequences_per_step,), generator=self.generator)
        self.optimizer.zero_grad()
        total = 0.0
        for index in picks.tolist():
            with self._autocast():
                loss = self.objective.loss(self.train_set[index], self.generator) / s.sequences_per_step
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.optimizer.step()
        return total

    def _autocast(self) -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.settings.precision == "bfloat16")

    # --- acceptance -----------------------------------------------------------------
    @torch.no_grad()
    def curve(self, examples: Sequence[Example] | None = None) -> Curve:
        curve = Curve.empty(self.objective.positions)
        for example in examples if examples is not None else self.held:
            curve.add(self.objective.accepted(example), example.first_generated)
        return curve

    def _evaluate(self, clock: Clock = time.monotonic) -> None:
        started = clock()
        curve = self.curve()
        self._eval_s = clock() - started
        score, self.estimate = curve.mean_accepted(self.k), curve.estimate(self.k)
        if score > self.best["score"]:
            self.best = {"score": score, "step": self.step, "curve": curve.to_json(),
                         "state": {k: v.clone() for k, v in self.net.state_dict().items()}}
