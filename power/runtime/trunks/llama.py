"""Dense llama-family trunks: `llama`, `qwen2`, `qwen3` (llama.cpp's LLM_ARCH_LLAMA / QWEN2 / QWEN3).

Per layer: pre-norm grouped-query attention with rope, then pre-norm SwiGLU.
The variants differ in small, header-visible ways handled here:
- rope: llama rotates adjacent pairs (`LLAMA_ROPE_TYPE_NORM`), qwen2/qwen3 the halves (NEOX);
- qwen3 normalises each query/key head (`attn_q_norm`, `attn_k_norm`);
- qwen2 adds biases to q/k/v (`attn_q.bias`, ...);
- `output.weight` absent means the output projection is tied to the embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from typing_extensions import override

from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.layers import apply_rope, gated_mlp, rope_rows, rope_tables
from power.runtime.trunks.base import ArchHeader, FixedShapeTrunk, TrunkOptions, Weights, slot_caches
from power.runtime.trunks.batch import DeviceRows
from power.runtime.trunks.protocol import TrunkConfig

NEOX_ARCHITECTURES = ("qwen2", "qwen3")


@dataclass(frozen=True)
class LlamaParams:
    arch: str
    d_model: int
    n_layers: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    rope_base: float
    vocab: int

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> LlamaParams:
        header = ArchHeader(gguf, gguf.architecture)
        return cls(
            arch=header.arch,
            d_model=header.d_model,
            n_layers=header.block_count,
            d_ff=header.d_ff,
            n_heads=header.n_heads,
            n_kv_heads=header.n_kv_heads,
            head_dim=header.key_length,
            eps=header.eps,
            rope_base=float(header.get("rope.freq_base", 10_000.0)),
            vocab=header.vocab,
        )


class LlamaLayer:
    def __init__(self, w: Weights, p: LlamaParams, i: int, caches: SlotCaches) -> None:
        b, d, q_dim, kv_dim = f"blk.{i}.", p.d_model, p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
        self.attn_norm = w.norm(b + "attn_norm.weight", [d], p.eps)
        self.split_qkv = [q_dim, kv_dim, kv_dim]
        self.qkv = w.fused(
            *((b + f"attn_{x}.weight", [rows, d]) for x, rows in zip("qkv", self.split_qkv, strict=True))
        )
        self.biases = [w.optional_tensor(b + f"attn_{x}.bias", [n]) for x, n in zip("qkv", self.split_qkv, strict=True)]
        self.q_norm = w.optional_norm(b + "attn_q_norm.weight", [p.head_dim], p.eps)
        self.k_norm = w.optional_norm(b + "attn_k_norm.weight", [p.head_dim], p.eps)
        self.wo = w.matrix(b + "attn_output.weight", [d, q_dim])
        self.ffn_norm = w.norm(b + "ffn_norm.weight", [d], p.eps)
        self.gate_up = w.fused((b + "ffn_gate.weight", [p.d_ff, d]), (b + "ffn_up.weight", [p.d_ff, d]))
        self.down = w.matrix(b + "ffn_down.weight", [d, p.d_ff])
        self.caches = caches  # one per slot

    def __call__(self, h: torch.Tensor, batch: DeviceRows, rope: tuple[torch.Tensor, torch.Tensor],
                 p: LlamaParams) -> torch.Tensor:
        n, neox = h.shape[0], p.arch in NEOX_ARCHITECTURES
        x = self.attn_norm(h)
        q, k, v = (_biased(y, bias) for y, bias in zip(self.qkv(x).split(self.split_qkv, dim=-1), self.biases,
                                                       strict=True))
        q = q.reshape(n, p.n_heads, p.head_dim)
        k = k.reshape(n, p.n_kv_heads, p.head_dim)
        v = v.reshape(n, p.n_kv_heads, p.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        q, k = apply_rope(q, *rope, neox=neox), apply_rope(k, *rope, neox=neox)
        h = h + self.wo(batch.attend(self.caches, q, k, v, 1.0 / math.sqrt(p.head_dim)))
        return h + gated_mlp(self.ffn_norm(h), self.gate_up, self.down, F.silu)


class LlamaTrunk(FixedShapeTrunk):
    def __init__(self, gguf: GGUFFile, options: TrunkOptions) -> None:
        p = self.params = LlamaParams.from_gguf(gguf)
        w = Weights(gguf, options)
        self.embedding = w.embedding([p.vocab, p.d_model])
        self.layers = [LlamaLayer(w, p, i, slot_caches(options, p.n_kv_heads, p.head_dim, p.head_dim))
                       for i in range(p.n_layers)]
        self.rope = rope_tables(options.cache_capacity, p.head_dim, p.rope_base, device=options.device)
        config = TrunkConfig(architecture=p.arch, vocab_size=p.vocab, d_model=p.d_model, n_layers=p.n_layers,
                             n_ctx=options.n_ctx, verify_capacity=options.verify_capacity, snapshot_rows=0,
                             recurrent=False, slots=options.slots, device=options.device)
        output = w.lm_head([p.vocab, p.d_model])
        super().__init__(config, options, w, w.norm("output_norm.weight", [p.d_model], p.eps), output)

    @override
    def _run(self, tokens: torch.Tensor, batch: DeviceRows,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        rope = rope_rows(self.rope, batch.positions)
        h = self.embedding(tokens)  # [m, d]
        tapped = {}
        for i, layer in enumerate(self.layers):
            if i in taps:
                tapped[i] = h
            h = layer(h, batch, rope, self.params)
        if self.params.n_layers in taps:
            tapped[self.params.n_layers] = h
        return h, tapped


def _biased(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x if bias is None else x + bias
