"""GGUF dequantisation: torch references, bit-exact against `gguf.quants.dequantize`.

Each reference takes the tensor's raw bytes as a flat uint8 torch tensor and the
logical torch shape (outermost first, i.e. the GGUF `ne` reversed) and returns a
float32 tensor of that shape. The arithmetic mirrors llama.cpp's
`dequantize_row_*` in float32, step for step, so results match to the bit.

Block layouts (bytes per block of `block_size` weights):
  Q4_0  18 B / 32: f16 d, 16 B nibbles                      w = d * (q - 8)
  Q5_0  22 B / 32: f16 d, u32 high bits, 16 B nibbles        w = d * (q - 16)
  Q8_0  34 B / 32: f16 d, 32 x int8                          w = d * q
  Q4_K 144 B / 256: f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles
  Q5_K 176 B / 256: as Q4_K plus 32 B of fifth bits
  Q6_K 210 B / 256: 128 B low nibbles, 64 B high 2-bits, 16 x int8 scales, f16 d
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import triton
import triton.language as tl

QK_K = 256

# GGML type name -> (weights per block, bytes per block)
BLOCK_LAYOUT: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q5_0": (32, 22),
    "Q8_0": (32, 34),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
}


class UnsupportedQuantType(ValueError):
    """A GGML type that has no dequantiser here."""


def _blocks(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """View raw bytes as [n_blocks, bytes_per_block]."""
    _, type_size = BLOCK_LAYOUT[qtype]
    return raw.reshape(-1, type_size)


def _f16(raw_pairs: torch.Tensor) -> torch.Tensor:
    """[..., 2] little-endian bytes -> [..., 1] float32 via float16."""
    return raw_pairs.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2, n]: low nibbles first, then high nibbles."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-2)


def dequantize_f32_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    return raw.contiguous().view(torch.float32).reshape(shape).clone()


def dequantize_f16_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).to(torch.float32).reshape(shape)


def dequantize_bf16_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    return raw.contiguous().view(torch.bfloat16).to(torch.float32).reshape(shape)


def dequantize_q4_0_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_0")
    d = _f16(blocks[:, :2])  # [n, 1]
    q = _nibbles(blocks[:, 2:]).reshape(-1, 32).to(torch.int8) - 8  # [n, 32]
    return (d * q.to(torch.float32)).reshape(shape)


def dequantize_q5_0_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q5_0")
    d = _f16(blocks[:, :2])  # [n, 1]
    high_bits = blocks[:, 2:6].contiguous().view(torch.int32)  # [n, 1], bit i is weight i's fifth bit
    shifts = torch.arange(32, dtype=torch.int32, device=raw.device)
    qh = ((high_bits >> shifts) & 1).to(torch.uint8)  # [n, 32]
    ql = _nibbles(blocks[:, 6:]).reshape(-1, 32)  # [n, 32]
    q = (ql | (qh << 4)).to(torch.int8) - 16
    return (d * q.to(torch.float32)).reshape(shape)


def dequantize_q8_0_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q8_0")
    d = _f16(blocks[:, :2])  # [n, 1]
    q = blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)  # [n, 32]
    return (d * q).reshape(shape)


def _k_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte 6-bit scale/min table of Q4_K/Q5_K into two [n, 8] uint8 tensors."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc, mn


def _k_dequant(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Shared tail of Q4_K/Q5_K: w = d * sc * q - dmin * min, per 32-weight sub-block."""
    d = _f16(blocks[:, 0:2])  # [n, 1]
    dmin = _f16(blocks[:, 2:4])
    sc, mn = _k_scales_mins(blocks[:, 4:16])
    scale = (d * sc.to(torch.float32)).reshape(-1, 8, 1)
    offset = (dmin * mn.to(torch.float32)).reshape(-1, 8, 1)
    return (scale * q.to(torch.float32) - offset).reshape(-1, QK_K)


def dequantize_q4_k_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_K")
    q = _nibbles(blocks[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32)  # [n, 8 sub-blocks, 32]
    return _k_dequant(blocks, q).reshape(shape)


def dequantize_q5_k_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q5_K")
    shifts = torch.arange(8, dtype=torch.uint8, device=raw.device).reshape(1, 8, 1)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> shifts  # [n, 8, 32]
    ql = _nibbles(blocks[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    q = ql | ((qh & 1) << 4)
    return _k_dequant(blocks, q).reshape(shape)


def dequantize_q6_k_reference(raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    blocks = _blocks(raw, "Q6_K")
    ql = _nibbles(blocks[:, :128].reshape(-1, 2, 64)).reshape(-1, 8, 32)  # [n, 8, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device).reshape(1, 1, 4, 1)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts
    qh = (qh & 0x03).reshape(-1, 8, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)  # [n, 16]
    d = _f16(blocks[:, 208:210])  # [n, 1]
    scale = (d * scales).reshape(-1, 16, 1)
    return (scale * q.reshape(-1, 16, 16).to(torch.float32)).reshape(shape)


REFERENCES: dict[str, Callable[[torch.Tensor, Sequence[int]], torch.Tensor]] = {
    "F32": dequantize_f32_reference,
    "F16": dequantize_f16_reference,
    "BF16": dequantize_bf16_reference,
    "Q4_0": dequantize_q4_0_reference,
    "Q5_0": dequantize_q5_0_reference,
    "Q8_0": dequantize_q8_0_reference,
    "Q4_K": dequantize_q4_k_reference,
    "Q5_K": dequantize_q5_k_reference,
    "Q6_K": dequantize_q6_k_reference,
}


def dequantize_reference(qtype: str, raw: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Dequantise `raw` (flat uint8) of GGML type `qtype` (e.g. "Q4_K") to float32 of `shape`."""
    if qtype not in REFERENCES:
        supported = ", ".join(REFERENCES)
        raise UnsupportedQuantType(f"no dequantiser for GGML type {qtype} (supported: {supported})")
    return REFERENCES[qtype](raw, shape)


# Triton: the same arithmetic per element, for the types the runtime keeps packed on a GPU.
# Each `_<type>` helper takes a pointer to every element's block and the element's index in that
# block, and returns float32 values with exactly the reference's operations (fp fusion is disabled
# at launch so the GPU cannot contract `scale * q - offset` into an FMA).

TRITON_TYPES: dict[str, int] = {"Q4_0": 0, "Q5_0": 1, "Q8_0": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5}
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
