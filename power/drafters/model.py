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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from power.artifacts.contracts import DrafterHparams, drafter_tensors
from power.runtime.layers import apply_rope, gated_mlp, rms_norm, rope_tables

WEIGHT_STD = 0.02


class BlockDrafterNet(nn.Module):
    """Every tensor of a `kind` drafter's contract as a parameter, named as in the GGUF (dots as `__`)."""

    embedding: torch.Tensor
    head: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, kind: str, hp: DrafterHparams, embedding: torch.Tensor, head: torch.Tensor,
                 max_positions: int, seed: int) -> None:
        super().__init__()
        self.kind, self.hp = kind, hp
        self.register_buffer("embedding", embedding, persistent=False)  # the target's [vocab, d], frozen
        self.register_buffer("head", head, persistent=False)  # the target's LM head cut to the FR prefix [N, d]
        generator = torch.Generator().manual_seed(seed)
        self.names = drafter_tensors(kind, hp)
        for name, shape in self.names.items():
            self.register_parameter(_attr(name), nn.Parameter(_initial(name, shape, generator)))
        cos, sin = rope_tables(max_positions, hp.head_dim, hp.rope_freq_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def tensor(self, name: str) -> torch.Tensor:
        return getattr(self, _attr(name))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The contract's tensors by GGUF name, detached, for export."""
        return {name: self.tensor(name).detach().clone() for name in self.names}

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
            u = rms_norm(x, w(f"blk.{i}.attn_norm.weight"), hp.rms_epsilon)
            x = x + self._attention(i, u, g, block_positions, mask)
            u = rms_norm(x, w(f"blk.{i}.ffn_norm.weight"), hp.rms_epsilon)
            x = x + gated_mlp(u, lambda v, i=i: torch.cat((v @ w(f"blk.{i}.ffn_gate.weight").T,
                                                          v @ w(f"blk.{i}.ffn_up.weight").T), dim=-1),
                              lambda v, i=i: v @ w(f"blk.{i}.ffn_down.weight").T, F.silu)
        return rms_norm(x, w("output_norm.weight"), hp.rms_epsilon).view(n_anchor, bs, -1)

    def markov(self, rows: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """DSpark: h' = h + output((hidden h) * token_embd[pred]) for rows [..., d], predecessors [...]."""
        w = self.tensor
        low = (rows @ w("markov.hidden.weight").T) * w("markov.token_embd.weight")[predecessors]
        return rows + low @ w("markov.output.weight").T

    def markov_logits(self, marked: torch.Tensor) -> torch.Tensor:
        return rms_norm(marked, self.tensor("markov.norm.weight"), self.hp.rms_epsilon) @ self.head.T

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


def _attr(name: str) -> str:
    return name.replace(".", "__")


def _initial(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Norms start at 1, the confidence bias at 0, matrices at normal(0, 0.02)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name == "confidence.bias":
        return torch.zeros(shape)
    return torch.randn(shape, generator=generator) * WEIGHT_STD

