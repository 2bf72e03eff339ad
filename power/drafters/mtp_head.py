"""The Gemma 3 MTP head as a trainable torch module: the chain `power.runtime.speculators.mtp`
runs, every position at once.

At inference (`MTPHead`) the head commits one row per landed token, pairing
token t_p with the target's final residual h_{p-1}, and drafts a chain from an
anchor: draft 1 from (anchor, h), draft s + 1 from (draft s, y_s), each row
attending to the committed rows before it, the chain's earlier rows and itself.
Here a whole sequence runs at once, level by level (EAGLE-3's training-time
test, arXiv:2503.01840): level 1 is every committed row (teacher-forced, causal);
level s + 1 at position p reads level s's output at p - 1 as its h and the text's
token at p as its input, and attends exactly what the runtime's cache holds when
that row is drafted from the anchor a = p - s: the level-1 rows at positions
1..a, the chain's rows at a + 1..p - 1 (one per level), itself, and the zero
slot at position 0 (which the head never writes). Up to the first miss the
drafts are the text's tokens, so level s's rows are exactly the rows the chain
drafts, and the acceptance counted from them is verification's.

The arithmetic is the runtime's (`gemma3_layer`, `rms_norm`, `attention`); the
tensors are the sidecar's, under their GGUF names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from power.artifacts.contracts import gemma3_block_tensors, nextn_tensors
from power.runtime.layers import Norm, attention, rms_norm, rope_rows
from power.runtime.trunks.gemma3 import Gemma3LayerWeights, Gemma3Params, gemma3_layer, stacked_qk_norm

from .generate import NO_LABEL, NOT_SCORED, Example
from .model import GGUFTensors, weighted_ce

# follow(level, rows, normed rows) -> bool [n]: which rows' chains draft one more level
Follow = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def mtp_tensors(p: Gemma3Params) -> dict[str, tuple[int, ...]]:
    """The sidecar's tensors: a Gemma 3 block at `blk.{n_layers}` and its nextn projection and norms."""
    return (gemma3_block_tensors(p.n_layers, p.d_model, p.n_heads, p.n_kv_heads, p.head_dim_k, p.head_dim_v, p.d_ff)
            | nextn_tensors(p.n_layers, p.d_model))


class MTPHeadNet(GGUFTensors):
    """Every tensor of the sidecar, over the target's frozen embedding and its LM head's draft-vocabulary rows."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, p: Gemma3Params, embedding: torch.Tensor, head: torch.Tensor, max_positions: int, seed: int,
                 start: dict[str, torch.Tensor] | None = None, draft_tokens: torch.Tensor | None = None) -> None:
        """`start`: initial values by GGUF name (an exported head's); the rest normal(0, 0.02), norms 1."""
        super().__init__(mtp_tensors(p), embedding, head, seed, start, draft_tokens)
        self.p = p
        cos, sin = p.rope(True, max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def chain(self, hidden: torch.Tensor, tokens: torch.Tensor, levels: int,
              follow: Follow | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One sequence: hidden [T, d] (the target's final residuals), tokens [T] -> per level, the rows it ran
        (indices r of positions r + 1) and their normed outputs [n, d], whose argmax over the head is the draft.

        Level 0 runs every position 1..T-1; level s + 1 runs row r + 1 for each row r of level s that `follow` keeps
        (default: all), i.e. the chains still drafting."""
        p, w, n = self.p, self.tensor, f"blk.{self.p.n_layers}."
        e = rms_norm(self.embedding[tokens[1:]] * p.embedding_scale, w(n + "nextn.enorm.weight"), p.eps)
        layer = self._layer_weights()
        keys: list[torch.Tensor] = [hidden.new_zeros(1, p.n_kv_heads, p.head_dim_k)]  # position 0: the zero slot
        values: list[torch.Tensor] = [hidden.new_zeros(1, p.n_kv_heads, p.head_dim_v)]
        ran: list[torch.Tensor] = []
        rows, h, out = torch.arange(len(tokens) - 1), hidden[:-1], []
        for level in range(levels):
            if not len(rows):
                break
            ran.append(rows)
            mask = chain_mask(rows, level, ran)

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor = mask) -> torch.Tensor:
                keys.append(k)
                values.append(v)
                k_all, v_all = torch.cat(keys).transpose(0, 1), torch.cat(values).transpose(0, 1)  # [Hkv, S, hd]
                return attention(q, k_all, v_all, mask, p.attention_scale)

            x = torch.cat([e[rows], rms_norm(h, w(n + "nextn.hnorm.weight"), p.eps)], dim=-1)
            y = gemma3_layer(x @ w(n + "nextn.eh_proj.weight").T, layer, rope_rows((self.cos, self.sin), rows + 1),
                             attend, p)
            normed = rms_norm(y, w(n + "nextn.shared_head_norm.weight"), p.eps)
            out.append((rows, normed))
            going = rows + 1 < len(e)
            if follow is not None:
                going &= follow(level, rows, normed)
            rows, h = rows[going] + 1, y[going]  # the next level at row r + 1 reads this one's y at r
        return out

    def _layer_weights(self) -> Gemma3LayerWeights:
        p, w, b = self.p, self.tensor, f"blk.{self.p.n_layers}."
        qkv = torch.cat([w(b + "attn_q.weight"), w(b + "attn_k.weight"), w(b + "attn_v.weight")])
        gate_up = torch.cat([w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])
        def norm(weight: torch.Tensor) -> Norm:
            return Norm(weight, p.eps, kernels=False)

        return Gemma3LayerWeights(
            attn_norm=norm(w(b + "attn_norm.weight")), qkv=lambda x: x @ qkv.T,
            qk_norm=norm(stacked_qk_norm(w(b + "attn_q_norm.weight"), w(b + "attn_k_norm.weight"), p)),
            wo=lambda x: x @ w(b + "attn_output.weight").T, post_attn_norm=norm(w(b + "post_attention_norm.weight")),
            ffn_norm=norm(w(b + "ffn_norm.weight")), gate_up=lambda x: x @ gate_up.T,
            down=lambda x: x @ w(b + "ffn_down.weight").T, post_ffn_norm=norm(w(b + "post_ffw_norm.weight")))


def chain_mask(rows: torch.Tensor, level: int, ran: list[torch.Tensor]) -> torch.Tensor:
    """Additive [n, 1 + keys]: what the level-`level` rows `rows` read, each drafted from the anchor row
    a = r - level, over the keys of the zero slot and the rows `ran[s]` of each level s <= level: level-0 rows up to
    a, and the level-s row a + s of the same chain (itself last)."""
    anchor = rows[:, None] - level
    seen = [torch.ones(len(rows), 1, dtype=torch.bool), ran[0][None] <= anchor]
    seen += [ran[s][None] == anchor + s for s in range(1, level + 1)]
    return torch.zeros(len(rows), sum(x.shape[1] for x in seen)).masked_fill(~torch.cat(seen, dim=1), float("-inf"))


def chain_targets(example: Example, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """labels [T - 1] (the target's greedy token after positions 1..T-1) and valid [levels, T - 1]: whether the
    level-s row at p counts, i.e. its anchor p - s is a position >= 1 and the text from the anchor to p is the
    target's own greedy path (each earlier draft of the chain was the target's token)."""
    tokens, labels = example.tokens, example.labels
    rows = len(tokens) - 1
    labelled = labels != NO_LABEL
    step = labelled[:-1] & (tokens[1:] == labels[:-1])  # step[j]: position j + 1 is the target's choice after j
    index = torch.arange(rows)
    last_miss = torch.where(~step, index, torch.full_like(index, -1)).cummax(dim=0).values
    run = index - last_miss  # run[r]: how many positions before p = r + 1 the greedy path reaches back
    level = torch.arange(levels)[:, None]
    position = index[None] + 1
    valid = labelled[1:][None] & (run[None] >= level) & (position - level >= 1)
    return labels[1:], valid


def chain_accepted(net: MTPHeadNet, example: Example, k: int) -> torch.Tensor:
    """Accepted drafts [T] of the chain of `k` from every anchor position, counted as verification counts them:
    drafts accepted up to the first that differs from the target's token; NOT_SCORED where the held-back text cannot
    score the chain to the end. A chain stops drafting at its first miss, so only the rows of chains still alive
    run."""
    token_ids, valid = chain_targets(example, k)
    labels = net.draft_labels(token_ids)
    anchors = torch.arange(max(0, len(labels) - k + 1))
    whole = valid[k - 1, anchors + k - 1] if len(anchors) else torch.zeros(0, dtype=torch.bool)
    scored = torch.zeros(len(labels), dtype=torch.bool)  # anchor rows of chains the text scores to the end
    scored[anchors[whole]] = True
    accepted = torch.zeros(len(labels), dtype=torch.long)

    def follow(level: int, rows: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        anchor = rows - level
        hit = ((normed @ net.head.T).argmax(-1) == labels[rows]) & scored[anchor]
        accepted[anchor] += hit.long()
        return hit

    if whole.any():
        net.chain(example.features.float(), example.tokens, k, follow)
    by_position = torch.full((len(example.tokens),), NOT_SCORED, dtype=torch.long)
    by_position[1:][scored] = accepted[scored]  # row r drafts from the anchor at position r + 1
    return by_position


@dataclass
class ChainObjective:
    """Every position of a sequence, `levels` chain steps deep, for `power.drafters.train.Trainer`: cross-entropy over
    the draft vocabulary at every level's valid rows, level s weighted decay ** s; acceptance over
    chains of `positions`."""

    net: MTPHeadNet
    levels: int = 3
    positions: int = 10
    decay: float = 0.8

    def loss(self, example: Example, generator: torch.Generator) -> torch.Tensor:  # noqa: ARG002 - draws nothing
        token_ids, valid = chain_targets(example, self.levels)
        labels = self.net.draft_labels(token_ids)
        valid = valid & (labels < len(self.net.head))[None]  # a label outside the draft vocabulary ends its chain

        def follow(level: int, rows: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return valid[level, rows]  # a chain the text cannot score any further is never drafted on

        logits, target, weights = [], [], []
        for level, (rows, normed) in enumerate(self.net.chain(example.features.float(), example.tokens, self.levels,
                                                              follow)):
            counted = valid[level, rows]
            logits.append(normed[counted] @ self.net.head.T)
            target.append(labels[rows[counted]])
            weights.append(torch.full((int(counted.sum()),), self.decay ** level))
        return weighted_ce(torch.cat(logits), torch.cat(target), torch.cat(weights))

    def accepted(self, example: Example) -> torch.Tensor:
        return chain_accepted(self.net, example, self.positions)
