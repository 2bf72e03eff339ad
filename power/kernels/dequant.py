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


# The types the GPU keeps packed and its Triton kernels read (`power.kernels.dequant_triton`), with their codes.
TRITON_TYPES: dict[str, int] = {"Q4_0": 0, "Q5_0": 1, "Q8_0": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5}
