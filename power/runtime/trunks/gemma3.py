"""Gemma 3 (llama.cpp `LLM_ARCH_GEMMA3`), e.g. the bundled 270M.

Per layer: pre-norm attention with QK norm and NEOX rope, a post-attention norm,
then pre-norm GeGLU (tanh gelu) with a post-FFN norm. Five sliding-window layers
(window from the header, rope base 10 000) alternate with one global layer
(the header's rope base): layer i is global when (i + 1) % 6 == 0. The input
embedding is scaled by sqrt(d_model); the output projection is tied to it.

The stored norm weights already include Gemma's "+1" (llama.cpp's converter adds
it), so they are applied as plain multipliers. Attention scale is
1/sqrt(key_length) (`query_pre_attn_scalar` = head width for the released
sizes other than 27B, which llama.cpp special-cases and this trunk does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from typing_extensions import override

from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.layers import Norm, apply_rope, gated_mlp, gelu_tanh, rope_rows, rope_tables
from power.runtime.trunks.base import ArchHeader, FixedShapeTrunk, TrunkOptions, Weights, slot_caches
from power.runtime.trunks.batch import DeviceRows
from power.runtime.trunks.protocol import TrunkConfig

ARCH = "gemma3"
SWA_PATTERN = 6  # every sixth layer is global
LOCAL_ROPE_BASE = 10_000.0


@dataclass(frozen=True)
class Gemma3Params:
    d_model: int
    n_layers: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    eps: float
    rope_base: float
    rope_scale: float
    window: int
    vocab: int
    logit_softcap: float | None

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Gemma3Params:
        header = ArchHeader(gguf, ARCH)
        return cls(
            d_model=header.d_model,
            n_layers=header.block_count,
            d_ff=header.d_ff,
            n_heads=header.n_heads,
            n_kv_heads=header.n_kv_heads,
            head_dim_k=header.key_length,
            head_dim_v=header.value_length,
            eps=header.eps,
            rope_base=float(header.get("rope.freq_base", 1_000_000.0)),
            rope_scale=float(header.get("rope.scaling.factor", 1.0)),
            window=int(header.require("attention.sliding_window")),
            vocab=header.vocab,
            logit_softcap=header.get("final_logit_softcapping"),
        )

    def is_global(self, layer: int) -> bool:
        return layer % SWA_PATTERN == SWA_PATTERN - 1


class Gemma3Layer:
    def __init__(self, w: Weights, p: Gemma3Params, i: int, caches: SlotCaches) -> None:
        b, d = f"blk.{i}.", p.d_model
        self.attn_norm = w.norm(b + "attn_norm.weight", [d], p.eps)
        self.split_qkv = [p.n_heads * p.head_dim_k, p.n_kv_heads * p.head_dim_k, p.n_kv_heads * p.head_dim_v]
        self.qkv = w.fused(*((b + f"attn_{x}.weight", [rows, d]) for x, rows in zip("qkv", self.split_qkv, strict=True)))
        q_norm = w.tensor(b + "attn_q_norm.weight", [p.head_dim_k])
        k_norm = w.tensor(b + "attn_k_norm.weight", [p.head_dim_k])
        # [H + Hkv, hd]: one norm, one rope over q and k together
        self.qk_norm = Norm(torch.stack([q_norm] * p.n_heads + [k_norm] * p.n_kv_heads), p.eps, w.kernels)
        self.wo = w.matrix(b + "attn_output.weight", [d, p.n_heads * p.head_dim_v])
        self.post_attn_norm = w.norm(b + "post_attention_norm.weight", [d], p.eps)
        self.ffn_norm = w.norm(b + "ffn_norm.weight", [d], p.eps)
        self.gate_up = w.fused((b + "ffn_gate.weight", [p.d_ff, d]), (b + "ffn_up.weight", [p.d_ff, d]))
        self.down = w.matrix(b + "ffn_down.weight", [d, p.d_ff])
        self.post_ffn_norm = w.norm(b + "post_ffw_norm.weight", [d], p.eps)
        self.caches = caches  # one per slot
        self.window = None if p.is_global(i) else p.window

    def __call__(self, h: torch.Tensor, batch: DeviceRows, rope: tuple[torch.Tensor, torch.Tensor],
                 p: Gemma3Params) -> torch.Tensor:
        n = h.shape[0]
        x = self.attn_norm(h)
        qk, v = self.qkv(x).split([self.split_qkv[0] + self.split_qkv[1], self.split_qkv[2]], dim=-1)
        qk = apply_rope(self.qk_norm(qk.reshape(n, -1, p.head_dim_k)), *rope, neox=True)
        q, k = qk.split([p.n_heads, p.n_kv_heads], dim=1)  # [n, H, hd], [n, Hkv, hd]
        v = v.reshape(n, p.n_kv_heads, p.head_dim_v)
        a = batch.attend(self.caches, q, k, v, 1.0 / math.sqrt(p.head_dim_k), self.window)
        h = h + self.post_attn_norm(self.wo(a))
        f = gated_mlp(self.ffn_norm(h), self.gate_up, self.down, gelu_tanh)
        return h + self.post_ffn_norm(f)


class Gemma3Trunk(FixedShapeTrunk):
    def __init__(self, gguf: GGUFFile, options: TrunkOptions) -> None:
        p = self.params = Gemma3Params.from_gguf(gguf)
        w = Weights(gguf, options)
        capacity = options.cache_capacity
        self.embedding = w.embedding([p.vocab, p.d_model])
        output = w.lm_head([p.vocab, p.d_model])  # tied to the embedding
        self.layers = [Gemma3Layer(w, p, i, slot_caches(options, p.n_kv_heads, p.head_dim_k, p.head_dim_v))
                       for i in range(p.n_layers)]
        self.local_rope = rope_tables(capacity, p.head_dim_k, LOCAL_ROPE_BASE, device=options.device)
        self.global_rope = rope_tables(capacity, p.head_dim_k, p.rope_base, p.rope_scale, options.device)
        config = TrunkConfig(architecture=ARCH, vocab_size=p.vocab, d_model=p.d_model, n_layers=p.n_layers,
                             n_ctx=options.n_ctx, verify_capacity=options.verify_capacity, snapshot_rows=0,
                             recurrent=False, slots=options.slots)
        super().__init__(config, options, w, w.norm("output_norm.weight", [p.d_model], p.eps), output, p.logit_softcap)

    @override
    def _run(self, tokens: torch.Tensor, batch: DeviceRows,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        p = self.params
        local_rope = rope_rows(self.local_rope, batch.positions)
        global_rope = rope_rows(self.global_rope, batch.positions)
        h = self.embedding(tokens) * math.sqrt(p.d_model)  # [m, d]
        tapped = {}
        for i, layer in enumerate(self.layers):
            if i in taps:
                tapped[i] = h
            h = layer(h, batch, local_rope if layer.window else global_rope, p)
        if p.n_layers in taps:
            tapped[p.n_layers] = h
        return h, tapped
