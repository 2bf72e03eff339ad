"""Gemma 3 (llama.cpp `LLM_ARCH_GEMMA3`), e.g. the bundled 270M.

Per layer: pre-norm attention with QK norm and NEOX rope, a post-attention norm,
then pre-norm GeGLU (tanh gelu) with a post-FFN norm. Five sliding-window layers
(window from the header, rope base 10 000) alternate with one global layer
(the header's rope base): layer i is global when (i + 1) % 6 == 0. The input
embedding is scaled by sqrt(d_model); the output projection is tied to it.

`{arch}.nextn_predict_layers` blocks past the trunk (an MTP head,
`power.runtime.speculators.mtp`) are Gemma 3 layers too, global ones; the trunk
does not run them. `gemma3_layer` is one layer's arithmetic whatever holds its
keys and values: the trunk's caches here, the head's own cache, or a training
mask (`power.drafters.mtp_head`).

The stored norm weights already include Gemma's "+1" (llama.cpp's converter adds
it), so they are applied as plain multipliers. Attention scale is
1/sqrt(key_length) (`query_pre_attn_scalar` = head width for the released
sizes other than 27B, which llama.cpp special-cases and this trunk does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from typing_extensions import override

from power.kernels.cpu.layer import Gemma3LayerKernel
from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.layers import Norm, apply_rope, gated_mlp, gelu_tanh, rope_rows, rope_tables
from power.runtime.linear import kernel_products
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
            n_layers=header.block_count - int(header.get("nextn_predict_layers", 0)),
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
        """Every sixth trunk layer, and every nextn block past the trunk."""
        return layer >= self.n_layers or layer % SWA_PATTERN == SWA_PATTERN - 1

    @property
    def embedding_scale(self) -> float:
        return math.sqrt(self.d_model)

    @property
    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim_k)

    def rope(self, is_global: bool, positions: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The rope tables of a global layer (the header's base and scaling) or a local one (base 10 000)."""
        if is_global:
            return rope_tables(positions, self.head_dim_k, self.rope_base, self.rope_scale, device)
        return rope_tables(positions, self.head_dim_k, LOCAL_ROPE_BASE, device=device)


Matrix = Callable[[torch.Tensor], torch.Tensor]  # x [n, in] -> x @ W.T [n, out]
Normed = Callable[[torch.Tensor], torch.Tensor]  # x [..., d] -> rms_norm(x) * weight (`power.runtime.layers.Norm`)
# q [n, H, hd], k [n, Hkv, hd], v [n, Hkv, hd_v] -> attention output [n, H * hd_v]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Gemma3LayerWeights:
    """One layer's weights as `gemma3_layer` reads them: norms and matrices as the callables that apply them."""

    attn_norm: Normed
    qkv: Matrix  # q, k and v side by side
    qk_norm: Normed  # weight [H + Hkv, hd]: the q norm per query head, then the k norm per KV head
    wo: Matrix
    post_attn_norm: Normed
    ffn_norm: Normed
    gate_up: Matrix  # gate, then up
    down: Matrix
    post_ffn_norm: Normed


def stacked_qk_norm(q_norm: torch.Tensor, k_norm: torch.Tensor, p: Gemma3Params) -> torch.Tensor:
    return torch.stack([q_norm] * p.n_heads + [k_norm] * p.n_kv_heads)  # one norm, one rope over q and k


def gemma3_layer(h: torch.Tensor, w: Gemma3LayerWeights, rope: tuple[torch.Tensor, torch.Tensor], attend: Attend,
                 p: Gemma3Params) -> torch.Tensor:
    """One Gemma 3 layer over rows h [n, d] at the positions `rope` holds; `attend` decides what they see."""
    n = h.shape[0]
    x = w.attn_norm(h)
    qk, v = w.qkv(x).split([(p.n_heads + p.n_kv_heads) * p.head_dim_k, p.n_kv_heads * p.head_dim_v], dim=-1)
    qk = apply_rope(w.qk_norm(qk.reshape(n, -1, p.head_dim_k)), *rope, neox=True)
    q, k = qk.split([p.n_heads, p.n_kv_heads], dim=1)  # [n, H, hd], [n, Hkv, hd]
    a = attend(q, k, v.reshape(n, p.n_kv_heads, p.head_dim_v))
    h = h + w.post_attn_norm(w.wo(a))
    f = gated_mlp(w.ffn_norm(h), w.gate_up, w.down, gelu_tanh)
    return h + w.post_ffn_norm(f)


def gemma3_layer_kernel(w: Gemma3LayerWeights, p: Gemma3Params, window: int | None) -> Gemma3LayerKernel | None:
    """The layer as one CPU kernel call (`power.kernels.cpu.layer`, the same bits as `gemma3_layer`), where every
    matrix is the CPU kernels' products and every norm takes the CPU row kernels; None elsewhere."""
    norms = (w.attn_norm, w.qk_norm, w.post_attn_norm, w.ffn_norm, w.post_ffn_norm)
    weights = [n.weight for n in norms if isinstance(n, Norm) and n.weight is not None and not n.kernels]
    products = [m for m in (kernel_products(m) for m in (w.qkv, w.wo, w.gate_up, w.down)) if m is not None]
    if len(weights) != len(norms) or len(products) != 4:
        return None
    return Gemma3LayerKernel(weights, products, (p.n_heads, p.n_kv_heads, p.head_dim_k, p.head_dim_v, p.d_ff), p.eps,
                             p.attention_scale, window or 0)


class Gemma3Layer:
    """Layer `i` of a Gemma 3 file over the trunk's caches (one per slot); run as one kernel call where
    `gemma3_layer_kernel` gives one and `layer_kernels` asks for it, else op by op (`gemma3_layer`)."""

    def __init__(self, w: Weights, p: Gemma3Params, i: int, caches: SlotCaches, layer_kernels: bool) -> None:
        b, d = f"blk.{i}.", p.d_model
        rows = (p.n_heads * p.head_dim_k, p.n_kv_heads * p.head_dim_k, p.n_kv_heads * p.head_dim_v)
        qk_norm = stacked_qk_norm(w.tensor(b + "attn_q_norm.weight", [p.head_dim_k]),
                                  w.tensor(b + "attn_k_norm.weight", [p.head_dim_k]), p)
        self.weights = Gemma3LayerWeights(
            attn_norm=w.norm(b + "attn_norm.weight", [d], p.eps),
            qkv=w.fused(*((b + f"attn_{x}.weight", [r, d]) for x, r in zip("qkv", rows, strict=True))),
            qk_norm=Norm(qk_norm, p.eps, w.kernels),
            wo=w.matrix(b + "attn_output.weight", [d, p.n_heads * p.head_dim_v]),
            post_attn_norm=w.norm(b + "post_attention_norm.weight", [d], p.eps),
            ffn_norm=w.norm(b + "ffn_norm.weight", [d], p.eps),
            gate_up=w.fused((b + "ffn_gate.weight", [p.d_ff, d]), (b + "ffn_up.weight", [p.d_ff, d])),
            down=w.matrix(b + "ffn_down.weight", [d, p.d_ff]),
            post_ffn_norm=w.norm(b + "post_ffw_norm.weight", [d], p.eps),
        )
        self.caches = caches  # one per slot
        self.window = None if p.is_global(i) else p.window
        self.kernel = gemma3_layer_kernel(self.weights, p, self.window) if layer_kernels else None

    def __call__(self, h: torch.Tensor, batch: DeviceRows, rope: tuple[torch.Tensor, torch.Tensor],
                 p: Gemma3Params) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(h, *rope, self.caches.k, self.caches.v, batch.slots, batch.positions)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return batch.attend(self.caches, q, k, v, p.attention_scale, self.window)

        return gemma3_layer(h, self.weights, rope, attend, p)


class Gemma3Trunk(FixedShapeTrunk):
    def __init__(self, gguf: GGUFFile, options: TrunkOptions) -> None:
        p = self.params = Gemma3Params.from_gguf(gguf)
        w = Weights(gguf, options)
        capacity = options.cache_capacity
        self.embedding = w.embedding([p.vocab, p.d_model])
        output = w.lm_head([p.vocab, p.d_model])  # tied to the embedding
        self.layers = [Gemma3Layer(w, p, i, slot_caches(options, p.n_kv_heads, p.head_dim_k, p.head_dim_v),
                                   options.layer_kernels) for i in range(p.n_layers)]
        self.local_rope = p.rope(False, capacity, options.device)
        self.global_rope = p.rope(True, capacity, options.device)
        config = TrunkConfig(architecture=ARCH, vocab_size=p.vocab, d_model=p.d_model, n_layers=p.n_layers,
                             n_ctx=options.n_ctx, verify_capacity=options.verify_capacity, snapshot_rows=0,
                             recurrent=False, slots=options.slots, device=options.device)
        super().__init__(config, options, w, w.norm("output_norm.weight", [p.d_model], p.eps), output, p.logit_softcap)

    @override
    def _run(self, tokens: torch.Tensor, batch: DeviceRows,
             taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        p = self.params
        local_rope = rope_rows(self.local_rope, batch.positions)
        global_rope = rope_rows(self.global_rope, batch.positions)
        h = self.embedding(tokens) * p.embedding_scale  # [m, d]
        tapped = {}
        for i, layer in enumerate(self.layers):
            if i in taps:
                tapped[i] = h
            h = layer(h, batch, local_rope if layer.window else global_rope, p)
        if p.n_layers in taps:
            tapped[p.n_layers] = h
        return h, tapped
