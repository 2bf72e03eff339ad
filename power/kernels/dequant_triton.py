"""GGUF dequantisation in Triton: the references' arithmetic (`power.kernels.dequant`) per element, for the types
the runtime keeps packed on a GPU (`TRITON_TYPES`), bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from power.kernels.dequant import BLOCK_LAYOUT, TRITON_TYPES

# Each `_<type>` helper takes a pointer to every element's block and the element's index in that
# block, and returns float32 values with exactly the reference's operations (fp fusion is disabled
# at launch so the GPU cannot contract `scale * q - offset` into an FMA).

_TRITON_WEIGHTS = 1024  # per program (whole quant blocks): larger tiles spill registers on sm_90 for the K-quants


@triton.jit
def _byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16_at(ptr, mask):
    bits = _byte(ptr, mask) | (_byte(ptr + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(qs_ptr, e, mask, HALF: tl.constexpr):
    """Weight e's 4 bits when the low nibbles of HALF bytes hold weights [0, HALF) and the high ones the rest."""
    return (_byte(qs_ptr + e % HALF, mask) >> (4 * (e // HALF))) & 0x0F


@triton.jit
def _q4_0(block, e, mask):
    q = _nibble(block + 2, e, mask, 16) - 8
    return _f16_at(block, mask) * q.to(tl.float32)


@triton.jit
def _q5_0(block, e, mask):
    high = (_byte(block + 2 + e // 8, mask) >> (e % 8)) & 1
    q = (_nibble(block + 6, e, mask, 16) | (high << 4)) - 16
    return _f16_at(block, mask) * q.to(tl.float32)


@triton.jit
def _q8_0(block, e, mask):
    q = tl.load(block + 2 + e, mask=mask, other=0).to(tl.int8, bitcast=True)
    return _f16_at(block, mask) * q.to(tl.float32)


@triton.jit
def _k_tail(block, e, q, mask):
    """w = (d * scale_j) * q - dmin * min_j for sub-block j = e // 32, scales unpacked from 6 bits."""
    j = e // 32
    low = j < 4
    j4 = j % 4
    first = _byte(block + 4 + j4, mask)  # scale bits of sub-block j4, top 2 bits of j4 + 4's scale
    second = _byte(block + 8 + j4, mask)  # min bits of sub-block j4, top 2 bits of j4 + 4's min
    third = _byte(block + 12 + j4, mask)  # low 4 bits of sub-block j4 + 4's scale and min
    scale = tl.where(low, first & 0x3F, (third & 0x0F) | ((first >> 6) << 4))
    minimum = tl.where(low, second & 0x3F, (third >> 4) | ((second >> 6) << 4))
    d = _f16_at(block, mask) * scale.to(tl.float32)
    dmin = _f16_at(block + 2, mask) * minimum.to(tl.float32)
    return d * q.to(tl.float32) - dmin


@triton.jit
def _k_nibble(qs_ptr, e, mask):
    """Q4_K/Q5_K low bits: sub-block pairs (2c, 2c + 1) share 32 bytes, low then high nibbles."""
    return (_byte(qs_ptr + (e // 64) * 32 + e % 32, mask) >> (4 * ((e // 32) % 2))) & 0x0F


@triton.jit
def _q4_k(block, e, mask):
    return _k_tail(block, e, _k_nibble(block + 16, e, mask), mask)


@triton.jit
def _q5_k(block, e, mask):
    high = (_byte(block + 16 + e % 32, mask) >> (e // 32)) & 1
    return _k_tail(block, e, _k_nibble(block + 48, e, mask) | (high << 4), mask)


@triton.jit
def _q6_k(block, e, mask):
    r = e % 128  # position within the block's half
    half = e // 128
    low = (_byte(block + half * 64 + r % 64, mask) >> (4 * (r // 64))) & 0x0F
    high = (_byte(block + 128 + half * 32 + r % 32, mask) >> (2 * (r // 32))) & 0x03
    q = (low | (high << 4)) - 32
    scale = tl.load(block + 192 + e // 16, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    return (_f16_at(block + 208, mask) * scale) * q.to(tl.float32)


@triton.jit
def dequant_values(base, block_index, e, mask, QTYPE: tl.constexpr):
    """Float32 weights at (block_index, e) of packed GGUF data at `base`, QTYPE a TRITON_TYPES code."""
    if QTYPE == 0:
        return _q4_0(base + block_index * 18, e, mask)
    elif QTYPE == 1:
        return _q5_0(base + block_index * 22, e, mask)
    elif QTYPE == 2:
        return _q8_0(base + block_index * 34, e, mask)
    elif QTYPE == 3:
        return _q4_k(base + block_index * 144, e, mask)
    elif QTYPE == 4:
        return _q5_k(base + block_index * 176, e, mask)
    elif QTYPE == 5:
        return _q6_k(base + block_index * 210, e, mask)
    else:  # F16 (qmatmul only), read in steps of 32 weights: 64 bytes
        return _f16_at(base + block_index * 64 + e * 2, mask)


@triton.jit
def _dequant_kernel(raw_ptr, out_ptr, n_blocks, PER_BLOCK: tl.constexpr, QTYPE: tl.constexpr,
                    BLOCKS: tl.constexpr):
    # A [BLOCKS, PER_BLOCK] tile of whole quant blocks: a block's scales load once, broadcast over its weights.
    blocks = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)[:, None]
    e = tl.arange(0, PER_BLOCK)[None, :]
    values = dequant_values(raw_ptr, blocks, e, blocks < n_blocks, QTYPE)
    tl.store(out_ptr + blocks * PER_BLOCK + e, values, mask=blocks < n_blocks)


def dequantize_triton(qtype: str, raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Same contract and bits as `dequantize_reference`, for the types in TRITON_TYPES."""
    per_block, _ = BLOCK_LAYOUT[qtype]
    out = torch.empty(tuple(shape), dtype=torch.float32, device=raw.device)
    n_blocks = out.numel() // per_block
    blocks = _TRITON_WEIGHTS // per_block
    _dequant_kernel[(triton.cdiv(n_blocks, blocks),)](raw, out, n_blocks, PER_BLOCK=per_block,
                                                       QTYPE=TRITON_TYPES[qtype], BLOCKS=blocks, enable_fp_fusion=False)
    return out
