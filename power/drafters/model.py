"""The block drafter as a trainable torch module: the forward `power.runtime.speculators.dflash` runs, batched.

At inference (`BlockDrafter`) the drafter commits the target's tapped rows one
round at a time into its KV ring and runs one block `[anchor, MASK x (bs - 1)]`
per round. Here every anchor of a sequence runs at once: the context keys and
values come from the whole sequence's tapped rows, and a mask lets the block of
anchor `a` see exactly what the ring holds when `a` is the anchor (positions
`[a - window, a)`) and its own block, bidirectionally. The arithmetic is the
runtime's own functions (`power.runtime.layers`), so what is trained is what
runs; `tests/test_drafter_distill.py` checks the rows against `BlockDrafter`.

DSpark's Markov and confidence heads sit on the backbone's rows; they are
trained with teacher forcing (the predecessor is the target's own token, which
is what an accepted draft is).

`BlockObjective` is what `power.drafters.train.Trainer` trains a block drafter
on: teacher-forced blocks at random anchors. For an anchor at position `a` the
block's draft row `e` (1..bs-1) must say the target's greedy token after
`a + e - 1`, and it only counts while the sequence followed the target greedily
from `a` on (always, in self-generated text; in a corpus, where the text and the
target agree). The loss is cross-entropy over the draft vocabulary
(`power.drafters.vocabulary`; labels outside it cannot be drafted and are left out), weighted
`decay ** (e - 1)`: an early position gates every later one; less the drafts the block accepts in
expectation (`expected_accepted`), which weights each position by what it unlocks. A held-back
block's drafts are accepted up to the first one that differs from the target
(and, for DSpark, up to the first row under the confidence threshold); the
Markov head is fed the target's tokens, which up to the first miss are the
drafts it would chain at inference, so the count is exact.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from power.artifacts.contracts import DrafterHparams, drafter_tensors, required
from power.modes import DFLASH2, DSPARK
from power.runtime.layers import apply_rope, gated_mlp, rms_norm, rope_tables, softcap
from power.runtime.speculators.dflash import grouped_conv

from .generate import NO_LABEL, NOT_SCORED, Example

WEIGHT_STD = 0.02


class GGUFTensors(nn.Module):
    """A module whose parameters are a GGUF file's tensors, by name (dots as `__`), over the target's frozen token
    embedding [vocab, d] and its LM head's rows for the draft vocabulary [N, d] (`draft_tokens`, default the first
    N IDs)."""

    embedding: torch.Tensor
    head: torch.Tensor
    draft_index: torch.Tensor
    draft_ids: torch.Tensor

    def __init__(self, names: dict[str, tuple[int, ...]], embedding: torch.Tensor, head: torch.Tensor, seed: int,
                 start: dict[str, torch.Tensor] | None = None, draft_tokens: torch.Tensor | None = None) -> None:
        """`start`: initial values by name (e.g. an exported file's); the rest normal(0, 0.02), norms 1, a bias 0."""
        super().__init__()
        self.register_buffer("embedding", embedding, persistent=False)
        self.register_buffer("head", head, persistent=False)
        n = len(head)
        index = torch.full((len(embedding),), n, dtype=torch.int64)  # n: not in the draft vocabulary
        ids = draft_tokens if draft_tokens is not None else torch.arange(n)
        index[ids] = torch.arange(n)
        self.register_buffer("draft_index", index, persistent=False)
        self.register_buffer("draft_ids", ids, persistent=False)  # each head row's token ID
        generator = torch.Generator().manual_seed(seed)
        self.names = names
        for name, shape in names.items():
            value = start[name].clone() if start and name in start else _initial(name, shape, generator)
            self.register_parameter(_attr(name), nn.Parameter(value))

    def tensor(self, name: str) -> torch.Tensor:
        return getattr(self, _attr(name))

    def draft_labels(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Each token ID's row in the head, or the head's row count where the draft vocabulary lacks it (or the ID is
        NO_LABEL)."""
        return torch.where(token_ids >= 0, self.draft_index[token_ids.clamp(min=0)], len(self.head))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The file's tensors by GGUF name, detached, for export."""
        return {name: self.tensor(name).detach().clone() for name in self.names}


class BlockDrafterNet(GGUFTensors):
    """Every tensor of a `kind` drafter's contract."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, kind: str, hp: DrafterHparams, embedding: torch.Tensor, head: torch.Tensor,
                 max_positions: int, seed: int, draft_tokens: torch.Tensor | None = None) -> None:
        super().__init__(drafter_tensors(kind, hp), embedding, head, seed, draft_tokens=draft_tokens)
        self.kind, self.hp = kind, hp
        cos, sin = rope_tables(max_positions, hp.head_dim, hp.rope_freq_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rows(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """One sequence: features [T, L*d] (the target's tapped rows), tokens [T], anchors [A] ->
        the normed block rows [A, bs, d] (row 0 the anchor, rows 1.. the drafts)."""
        hp, w = self.hp, self.tensor
        g = rms_norm(features @ w("fc.weight").T, w("enc.output_norm.weight"), hp.rms_epsilon)  # [T, d]
        bs, n_anchor, length = hp.block_size, len(anchors), len(tokens)
        block_positions = (anchors[:, None] + torch.arange(bs)[None]).reshape(-1)  # [A*bs]
        ids = torch.full((n_anchor, bs), hp.mask_token_id, dtype=torch.long)
        ids[:, 0] = tokens[anchors]
        x = self.embedding[ids.reshape(-1)]  # [A*bs, d], unscaled, as the runtime's TargetHead.embed
        mask = self._mask(anchors, length)
        for i in range(hp.block_count):
            x = self._sublayer(x, i, "attn", functools.partial(self._attention, i, g=g, positions=block_positions,
                                                                mask=mask))
            x = self._sublayer(x, i, "ffn", functools.partial(self._ffn, i))
        return rms_norm(x, w("output_norm.weight"), hp.rms_epsilon).view(n_anchor, bs, -1)

    def _ffn(self, layer: int, u: torch.Tensor) -> torch.Tensor:
        w, b = self.tensor, f"blk.{layer}."
        return gated_mlp(u, lambda v: torch.cat((v @ w(b + "ffn_gate.weight").T, v @ w(b + "ffn_up.weight").T), dim=-1),
                         lambda v: v @ w(b + "ffn_down.weight").T, F.silu)

    def _sublayer(self, x: torch.Tensor, layer: int, kind: str,
                  fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x [A*bs, d] + the sublayer `kind` of `layer` on its normed input; DFlash2 filters that input and the
        sublayer's output with its grouped dynamic convolution inside each block (the runtime's `_sublayer`)."""
        hp, w, b = self.hp, self.tensor, f"blk.{layer}.{kind}"
        u = rms_norm(x, w(f"{b}_norm.weight"), hp.rms_epsilon)
        if self.kind != DFLASH2:
            return x + fn(u)
        k, group = required(hp.conv_kernel_size, "conv_kernel_size"), required(hp.conv_group_size, "conv_group_size")
        base, blocks = w(f"{b}_conv_base.weight"), (-1, hp.block_size, hp.embedding_length)
        delta = (u @ w(f"{b}_conv_proj.weight").T).view(-1, hp.block_size, 2, k, hp.embedding_length // group)
        y = fn(grouped_conv(u.view(blocks), base[:k], delta[:, :, 0], group).reshape(len(u), -1))
        return x + grouped_conv(y.view(blocks), base[k:], delta[:, :, 1], group).reshape(len(u), -1)

    def markov(self, rows: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """DSpark: h' = h + output((hidden h) * token_embd[pred]) for rows [..., d], predecessors [...]."""
        w = self.tensor
        low = (rows @ w("markov.hidden.weight").T) * w("markov.token_embd.weight")[predecessors]
        return rows + low @ w("markov.output.weight").T

    def markov_logits(self, marked: torch.Tensor) -> torch.Tensor:
        return rms_norm(marked, self.tensor("markov.norm.weight"), self.hp.rms_epsilon) @ self.head.T

    def unary(self, rows: torch.Tensor) -> torch.Tensor:
        """DFlash2's unary term over the draft vocabulary: the target head's logits, scaled and soft-capped."""
        return softcap((rows @ self.head.T) * (self.hp.logit_scale or 1.0), self.hp.final_logit_softcapping)

    def transition(self, rows: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """DFlash2's selector term for every draft-vocabulary candidate: <A[pred] * (P h), B[cand]>, [..., N]."""
        w = self.tensor
        low = (rows @ w("selector_hidden.weight").T) * w("selector_predecessor.weight")[predecessors]
        return low @ w("selector_successor.weight")[self.draft_ids].T

    def selected(self, unary: torch.Tensor, rows: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """The selector's pick per row (a draft-vocabulary row): among the `unary` term's top-k candidates, the best
        unary + transition score, as the runtime's greedy walk picks it from these predecessors."""
        scores, picks = unary.topk(required(self.hp.selector_top_k, "selector_top_k"), dim=-1)
        chosen = (scores + self.transition(rows, predecessors).gather(-1, picks)).argmax(-1, keepdim=True)
        return picks.gather(-1, chosen).squeeze(-1)

    def confidence_logit(self, marked: torch.Tensor) -> torch.Tensor:
        return marked @ self.tensor("confidence.weight")[0] + self.tensor("confidence.bias")[0]

    def _attention(self, layer: int, u: torch.Tensor, g: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor) -> torch.Tensor:
        hp, b = self.hp, f"blk.{layer}."
        w = self.tensor
        n, length = len(u), len(g)
        q = (u @ w(b + "attn_q.weight").T).view(n, hp.head_count, hp.head_dim)
        q = self._rope(rms_norm(q, w(b + "attn_q_norm.weight"), hp.rms_epsilon), positions)
        keys, values = [], []
        for source, where in ((g, torch.arange(length)), (u, positions)):  # the ring's rows, then the block's
            k = (source @ w(b + "attn_k.weight").T).view(len(source), hp.head_count_kv, hp.head_dim)
            keys.append(self._rope(rms_norm(k, w(b + "attn_k_norm.weight"), hp.rms_epsilon), where))
            values.append((source @ w(b + "attn_v.weight").T).view(len(source), hp.head_count_kv, hp.head_dim))
        group = hp.head_count // hp.head_count_kv
        k_all = torch.cat(keys).repeat_interleave(group, dim=1).transpose(0, 1)  # [H, T + n, hd]
        v_all = torch.cat(values).repeat_interleave(group, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k_all, v_all, attn_mask=mask,
                                             scale=1.0 / math.sqrt(hp.head_dim))  # [H, n, hd]
        return out.transpose(0, 1).reshape(n, -1) @ w(b + "attn_output.weight").T

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, self.cos[positions], self.sin[positions], neox=True)

    def _mask(self, anchors: torch.Tensor, length: int) -> torch.Tensor:
        """[A*bs, T + A*bs] bool: a block row sees its ring (the window before its anchor) and its own block."""
        bs = self.hp.block_size
        window = self.hp.sliding_window or length
        context = torch.arange(length)[None]
        sees_ring = (context < anchors[:, None]) & (context >= anchors[:, None] - window)  # [A, T]
        own = torch.eye(len(anchors), dtype=torch.bool)  # [A, A]
        ring = sees_ring.repeat_interleave(bs, dim=0)
        block = own.repeat_interleave(bs, dim=0).repeat_interleave(bs, dim=1)
        return torch.cat((ring, block), dim=1)


@dataclass
class BlockObjective:
    """Teacher-forced blocks at random anchors (the module's docstring), for `power.drafters.train.Trainer`."""

    net: BlockDrafterNet
    anchors_per_sequence: int = 8
    position_decay: float = 0.8
    confidence_weight: float = 0.2
    acceptance_weight: float = 1.0

    @property
    def positions(self) -> int:
        return self.net.hp.block_size - 1

    def loss(self, example: Example, generator: torch.Generator) -> torch.Tensor:
        candidates = anchor_positions(example)
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:self.anchors_per_sequence]]
        anchors = chosen.sort().values
        net, hp = self.net, self.net.hp
        token_ids, valid = block_targets(example, anchors, hp.block_size)
        target = net.draft_labels(token_ids)
        valid = valid & (target < len(net.head))  # a label outside the draft vocabulary cannot be drafted
        rows = net.rows(example.features.float(), example.tokens, anchors)[:, 1:]  # [A, bs-1, d]
        weights = self.position_decay ** torch.arange(hp.block_size - 1, dtype=torch.float32)
        weights = weights[None].expand_as(target)[valid]
        if net.kind == DSPARK:
            marked = net.markov(rows, _predecessors(example, anchors, token_ids))
            logits = net.markov_logits(marked[valid])
            right = (logits.argmax(-1) == target[valid]).float()
            confidence = F.binary_cross_entropy_with_logits(net.confidence_logit(marked[valid]), right)
            return self._drafts_loss(logits, target, valid, weights) + self.confidence_weight * confidence
        if net.kind == DFLASH2:
            unary = net.unary(rows[valid])
            walked = unary + net.transition(rows[valid], _predecessors(example, anchors, token_ids)[valid])
            return weighted_ce(unary, target[valid], weights) + self._drafts_loss(walked, target, valid, weights)
        return self._drafts_loss(rows[valid] @ net.head.T, target, valid, weights)

    def _drafts_loss(self, logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
        """The drafts' position-weighted cross-entropy, less `acceptance_weight` x the drafts a block accepts in
        expectation (`expected_accepted`): logits [n, N] of the valid rows of target [A, P] / valid [A, P]."""
        expected = expected_accepted(logits, target[valid], valid)
        return weighted_ce(logits, target[valid], weights) - self.acceptance_weight * expected

    def accepted(self, example: Example) -> torch.Tensor:
        """Accepted drafts of the block at every anchor position, NOT_SCORED where the held-back text cannot score it
        to the end."""
        net, hp = self.net, self.net.hp
        anchors = anchor_positions(example)
        token_ids, valid = block_targets(example, anchors, hp.block_size)
        whole = valid.all(dim=1)
        anchors, token_ids = anchors[whole], token_ids[whole]
        accepted = torch.full((len(example.tokens),), NOT_SCORED, dtype=torch.long)
        if not len(anchors):
            return accepted
        target = net.draft_labels(token_ids)
        rows = net.rows(example.features.float(), example.tokens, anchors)[:, 1:]
        if net.kind == DSPARK:
            marked = net.markov(rows, _predecessors(example, anchors, token_ids))
            hit = net.markov_logits(marked).argmax(-1) == target
            hit = hit & (torch.sigmoid(net.confidence_logit(marked)) >= (hp.confidence_threshold or 0.0))
        elif net.kind == DFLASH2:
            hit = net.selected(net.unary(rows), rows, _predecessors(example, anchors, token_ids)) == target
        else:
            hit = (rows @ net.head.T).argmax(-1) == target
        accepted[anchors] = hit.long().cummin(dim=1).values.sum(dim=1)
        return accepted


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


def _predecessors(example: Example, anchors: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DSpark's Markov predecessor per draft row: the anchor, then the target's token at the row before."""
    first = example.tokens[anchors][:, None]
    return torch.cat((first, target[:, :-1].clamp(min=0)), dim=1)


def weighted_ce(logits: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per row, weighted, normalised by the weights (0 with a graph when no row counts)."""
    if not len(target):
        return logits.sum() * 0.0
    return (F.cross_entropy(logits, target, reduction="none") * weights).sum() / weights.sum()


def expected_accepted(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The drafts a block accepts in expectation, averaged over the blocks, when draft e is right with the module's
    probability p_e of the target's token: sum_e prod_{i<=e} p_i (the acceptance estimate's formula, soft and
    differentiable). Its gradient weights position j's log-probability by sum_{e>=j} prod_{i<=e} p_i, what getting j
    right is worth given the positions before it. logits [n, N] and target [n] are the valid rows of valid [A, P]; a
    round ends at its first row that does not count (past the text's greedy path, or a label the draft vocabulary
    lacks)."""
    log_p = torch.zeros(valid.shape, dtype=torch.float32).masked_scatter(
        valid, -F.cross_entropy(logits.float(), target, reduction="none"))
    reaching = torch.exp(torch.cumsum(log_p, dim=1)) * valid.int().cummin(dim=1).values
    return reaching.sum(dim=1).mean() if len(valid) else logits.sum() * 0.0


def _attr(name: str) -> str:
    return name.replace(".", "__")


def _initial(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Norms start at 1, the confidence bias at 0, DFlash2's convolutions as the identity (tap 0 of the input's and
    of the output's filters 1, no dynamic deltas), matrices at normal(0, 0.02)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name == "confidence.bias" or name.endswith("_conv_proj.weight"):
        return torch.zeros(shape)
    if name.endswith("_conv_base.weight"):
        identity = torch.zeros(shape)
        identity[[0, shape[0] // 2]] = 1.0
        return identity
    return torch.randn(shape, generator=generator) * WEIGHT_STD

