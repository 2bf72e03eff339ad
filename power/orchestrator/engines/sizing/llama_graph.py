"""The compute buffer llama.cpp reserves for its worst-case graph, term by term, from header fields.

How the number arises (llama.cpp 0c1e570):

- `llama_context::sched_reserve` (src/llama-context.cpp) builds the worst-case
  graph over the whole memory (every KV cache viewed at its full size) and
  reserves it three times, prompt-processing (pp), token-generation (tg), pp
  again. The pp graph has `T = min(n_ctx, n_ubatch)` tokens rounded up to a
  multiple of n_seq_max (`graph_reserve`), n_seq_max sequences and
  `min(T, n_outputs_max)` outputs; the tg graph (n_seq_max tokens) is always
  smaller. The buffer only grows, so its size is the pp graph's.
- `ggml_gallocr_reserve_n` (ggml/src/ggml-alloc.c) allocates that graph in one
  buffer: every size rounded up to the buffer's alignment (32 B on the CPU, 128 B
  for CUDA buffers); every graph input (`GGML_TENSOR_FLAG_INPUT`) first, at the
  bottom; then the nodes in order, each parent freed when its last consumer is
  allocated; in-place ops (scale, add, mul, norms, rope, soft_max, unary) reuse
  their parent's memory; placement is best fit among the free blocks, else the
  top, which is what grows the buffer. Its size is the high-water mark.

So the buffer is the inputs plus the largest set of activations alive at once,
including the holes freed tensors leave below it. Three moments can be that
peak (a port of ggml-alloc, ggml/src/ggml-alloc.c, replayed on graphs dumped
from llama-server showed which tensors are alive at each; the conformance test,
tests/test_llama_conformance.py, holds the result to the real binary's logged
buffers):

- ffn: allocating layer 0's FFN product (gate, up, their product) above the
  attention residual, with the freed ffn_norm slot (and, with flash attention
  and an attention first layer, the freed attention output) as a hole too small
  for it;
- kq (flash attention off): allocating the attention scores `kq` =
  cells x T x n_head f32 above the residual, the hole of the freed norm and raw
  Q, and the scaled, roped Q (gated Q models keep a double-width Q besides);
- out: allocating the logits `n_out x n_vocab` f32 after the final norm, above
  the token hole and the embeddings input.

All activations are f32 `[features, T]`. The form holds where the FFN product
does not fit the holes below it (n_ff > n_embd + n_head x head_dim, true of
every model Power knows); elsewhere it is an upper bound. It is checked against
llama-server's logged buffer, to the byte, for gemma3, llama, qwen2, qwen3 and
qwen35 (tests/test_llama_conformance.py); with many output rows (long drafts
on many slots) the logits may land above a few more holes than this form counts
(at most 2.5% more was measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from power.orchestrator.engines.sizing.model import pad

F32, I32, I64, F16 = 4, 4, 8, 2
# ggml_backend_buffer_type alignment: the CPU buffer type's TENSOR_ALIGNMENT, CUDA's 128.
CPU_ALIGNMENT = 32
CUDA_ALIGNMENT = 128

# Architectures whose graph builders this form reproduces (src/models/*.cpp): one attention cache and a
# SwiGLU FFN (dense), gemma3's sliding + global caches and GeGLU, qwen35's gated delta-net layers with
# interleaved gated-query attention and M-RoPE positions.
DENSE_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
ISWA_ARCHITECTURES = frozenset({"gemma3"})
HYBRID_ARCHITECTURES = frozenset({"qwen35"})
MODELLED_ARCHITECTURES = DENSE_ARCHITECTURES | ISWA_ARCHITECTURES | HYBRID_ARCHITECTURES
# qwen35 positions carry 4 values per token (M-RoPE sections: llama_hparams::n_pos_per_embd).
MROPE_POSITIONS = 4


@dataclass(frozen=True)
class GraphShape:
    """The header facts and context facts the reserved graph's sizes come from."""

    architecture: str
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    cache_cells: tuple[int, ...]  # cells per stream of each attention cache (a sliding cache and/or a global one)
    tokens: int  # T
    outputs: int  # n_out
    sequences: int  # n_seq_max
    flash_attn: bool
    quantized_kv: bool = False  # K and V in a block type (Power sets both alike: llama-server -ctk = -ctv)

    @property
    def modelled(self) -> bool:
        return self.architecture in MODELLED_ARCHITECTURES

    @property
    def first_layer_attention(self) -> bool:
        """qwen35's first layer is a delta-net layer: no flash-attention output below its FFN."""
        return self.architecture not in HYBRID_ARCHITECTURES

    @property
    def gated_query(self) -> bool:
        return self.architecture in HYBRID_ARCHITECTURES


@dataclass(frozen=True)
class Phase:
    name: str
    bytes: int
    terms: str


def compute_phases(shape: GraphShape, alignment: int, with_layers: bool = True,
                   with_output: bool = True) -> list[Phase]:
    """Each candidate peak with its terms; the buffer is the largest. `with_layers` / `with_output`: whether this
    buffer's backend runs the repeating layers / the output layer (one device of a layer split may hold either)."""
    a = alignment
    t, e = shape.tokens, shape.n_embd

    def p(n_bytes: int) -> int:
        return pad(n_bytes, a)

    row = p(F32 * t * e)
    tok = p(I32 * t)
    inputs, input_terms = input_bytes(shape, a)
    phases = []
    if with_layers:
        att = p(F32 * t * shape.n_head * shape.head_dim_v)
        ff = p(F32 * t * shape.n_ff)
        q = p(F32 * t * shape.n_head * shape.head_dim_k)
        if shape.flash_attn and shape.first_layer_attention:
            phases.append(Phase("ffn", inputs + row + att + row + 3 * ff,
                                f"inputs ({input_terms}) + ffn_norm hole {row} + attention output hole {att} + "
                                f"residual {row} + 3 x n_ff rows {ff}"))
        else:
            phases.append(Phase("ffn", inputs + 2 * row + 3 * ff,
                                f"inputs ({input_terms}) + ffn_norm hole {row} + residual {row} + 3 x n_ff rows {ff}"))
        if not shape.flash_attn:
            q_terms = 3 if shape.gated_query else 2
            for cells in sorted(set(shape.cache_cells)):
                kq = p(F32 * cells * t * shape.n_head)
                phases.append(Phase(f"kq ({cells} cells)", inputs + 2 * row + q_terms * q + kq,
                                    f"inputs ({input_terms}) + residual and norm hole 2 x {row} + "
                                    f"{q_terms} x Q {q} + scores {cells} x {t} x {shape.n_head} f32 {kq}"))
    if with_output:
        n_out = shape.outputs
        norm, logits = p(F32 * n_out * e), p(F32 * n_out * shape.n_vocab)
        phases.append(Phase("out", tok + row + norm + logits,
                            f"token hole {tok} + embeddings input {row} + final norm {n_out} x {e} f32 {norm} + "
                            f"logits {n_out} x {shape.n_vocab} f32 {logits}"))
    return phases


def mtp_phases(shape: GraphShape, alignment: int) -> list[Phase]:
    """qwen35's MTP head graph in a draft-mtp context (llama_model_qwen35::build_mtp, src/models/qwen35.cpp): one
    block over the target's hidden state. Its inputs are those of the trunk graph less inp_embd and rs_s_copy (the
    head embeds its tokens with get_rows and keeps no recurrent state); with a single block they are freed after the
    attention, so the FFN products take that hole where they fit (best fit, as ggml-alloc places them). Alive at each
    peak (replayed on dumps of the fixture and of a Qwen3.6-27B-shaped header, flash attention on and off):

    - attention (flash attention on): inputs + the embedding and eh_proj rows + double-width gated Q + roped Q + K, V;
    - kq (off): inputs + 2 rows + 3 Q + scores cells x T x n_head f32;
    - ffn: inputs + 2 rows (3 without flash attention: the freed embedding row stays below) + each FFN product that
      fits no hole."""
    def p(n_bytes: int) -> int:
        return pad(n_bytes, alignment)

    t = shape.tokens
    (cells,) = shape.cache_cells
    row, q, ff = p(F32 * t * shape.n_embd), p(F32 * t * shape.n_head * shape.head_dim_k), p(F32 * t * shape.n_ff)
    mask_element = F16 if shape.flash_attn else F32
    v_index = I64 * t if shape.flash_attn else I64 * t * shape.n_head_kv * shape.head_dim_v
    freed = p(I32 * t) + p(I32 * t * MROPE_POSITIONS) + p(I64 * t) + p(v_index) + p(mask_element * cells * t)
    inputs = freed + p(I32 * shape.outputs)
    terms = f"inputs {inputs} (tokens, positions, KV indices, mask {cells} cells, out_ids)"
    rows = 2 if shape.flash_attn else 3
    holes = [freed + (0 if shape.flash_attn else row), row]
    on_top = 0
    for _ in range(3):
        fitting = [i for i, hole in enumerate(holes) if hole >= ff]
        if fitting:
            best = min(fitting, key=lambda i: holes[i])
            holes[best] -= ff
        else:
            on_top += ff
    phases = [Phase("ffn", inputs + rows * row + on_top, f"{terms} + {rows} rows {row} + FFN products above the "
                                                         f"holes {on_top}")]
    if shape.flash_attn:
        kv = p(F32 * t * shape.n_head_kv * shape.head_dim_k) + p(F32 * t * shape.n_head_kv * shape.head_dim_v)
        phases.append(Phase("attention", inputs + 2 * row + 3 * q + kv,
                            f"{terms} + 2 rows {row} + gated Q 2 x {q} + Q {q} + K, V {kv}"))
    else:
        kq = p(F32 * cells * t * shape.n_head)
        phases.append(Phase(f"kq ({cells} cells)", inputs + 2 * row + 3 * q + kq,
                            f"{terms} + 2 rows {row} + 3 x Q {q} + scores {kq}"))
    return phases


def input_bytes(shape: GraphShape, alignment: int) -> tuple[int, str]:
    """The graph inputs, allocated before any node (llm_graph_input_* in src/llama-graph.cpp):
    inp_tokens i32 [T]; inp_embd f32 [n_embd, T] (the embeddings-input branch, always allocated);
    inp_pos i32 [T x positions per token]; qwen35's rs_s_copy i32 [max(1, n_seq)]; per attention cache
    k_idxs i64 [T], v_idxs i64 [T] (flash attention) or [T x n_head_kv x head_dim_v] (V stored transposed),
    the mask [cells, T] (f16 with flash attention, f32 without), and with a quantized cache the Hadamard
    rotations (llama_kv_cache::build_input_k_rot / _v_rot; K: [r, r], r the largest power of two >= 64
    dividing head_dim_k; V: [64, 64]); out_ids i32 [n_out]."""
    def p(n_bytes: int) -> int:
        return pad(n_bytes, alignment)

    t = shape.tokens
    positions = MROPE_POSITIONS if shape.architecture in HYBRID_ARCHITECTURES else 1
    parts = {"tokens": p(I32 * t), "embd": p(F32 * t * shape.n_embd), "pos": p(I32 * t * positions)}
    if shape.architecture in HYBRID_ARCHITECTURES:
        parts["rs_copy"] = p(I32 * max(1, shape.sequences))
    mask_element = F16 if shape.flash_attn else F32
    v_index = I64 * t if shape.flash_attn else I64 * t * shape.n_head_kv * shape.head_dim_v
    for index, cells in enumerate(shape.cache_cells):
        key = f"cache{index} {cells} cells"
        parts[key] = p(I64 * t) + p(v_index) + p(mask_element * cells * t)
        if shape.quantized_kv and shape.head_dim_k % 64 == 0:
            parts[key] += p(F32 * _k_rotation(shape.head_dim_k) ** 2)
        if shape.quantized_kv and shape.head_dim_v % 64 == 0:
            parts[key] += p(F32 * 64 * 64)
    parts["out_ids"] = p(I32 * shape.outputs)
    return sum(parts.values()), " + ".join(f"{name} {size}" for name, size in parts.items())


def _k_rotation(head_dim: int) -> int:
    """llama_kv_cache::build_input_k_rot: the largest power of two >= 64 that divides head_dim."""
    size = 64
    while head_dim % (size * 2) == 0:
        size *= 2
    return size


def compute_bytes(shape: GraphShape, alignment: int, with_layers: bool = True,
                  with_output: bool = True) -> tuple[int, Phase]:
    """The buffer size and the phase that sets it."""
    peak = max(compute_phases(shape, alignment, with_layers, with_output), key=lambda phase: phase.bytes)
    return peak.bytes, peak
