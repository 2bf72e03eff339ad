"""Cache rows in the plan's KV type: rounding float32 rows on write, and reading them back (`power.documents.kv_types`).

Each row [..., width] is rounded by itself (a q8_0 block's scale reads only its own 32 values), so a row's stored
bits do not depend on which rows were written beside it. Reading back is exact: f16 and bf16 widen to float32, and a
q8_0 value is d * q, an 11-bit scale times a 7-bit integer, exact in float32's 24 bits. The CPU attention kernel
(`power.kernels.cpu.rowops.attention`) reads the stored rows itself; `decode` is the same reading in torch.

Storage: f32 / f16 / bf16 rows as tensors of that dtype [..., width]; q8_0 rows as bytes [..., width / 32 * 34],
each block its f16 scale then its 32 int8 values (llama.cpp's `block_q8_0`).
"""

from __future__ import annotations

import torch

from power.documents.kv_types import BF16, F16, F32, Q8_0, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, row_bytes

DTYPES = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16, Q8_0: torch.uint8}


def stored_width(kv_type: str, width: int) -> int:
    """The last dimension of a stored row of `width` values: elements of `DTYPES[kv_type]`."""
    return row_bytes(kv_type, width) // DTYPES[kv_type].itemsize


def encode(rows: torch.Tensor, kv_type: str) -> torch.Tensor:
    """float32 rows [..., width] -> the stored rows in `kv_type`."""
    if kv_type != Q8_0:
        return rows.to(DTYPES[kv_type])
    blocks = rows.float().unflatten(-1, (-1, Q8_0_BLOCK))  # [..., nb, 32]
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    scaled = blocks * inverse
    # llama.cpp's quantize_row_q8_0_ref: roundf (halves away from zero) of x * (1 / d), d stored as f16
    values = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8)
    packed = torch.cat((scale.to(torch.float16).view(torch.uint8), values.view(torch.uint8)), dim=-1)
    return packed.flatten(-2)


def decode(stored: torch.Tensor, kv_type: str) -> torch.Tensor:
    """Stored rows in `kv_type` -> the float32 rows they hold, exactly."""
    if kv_type != Q8_0:
        return stored.float()
    blocks = stored.unflatten(-1, (-1, Q8_0_BLOCK_BYTES))
    scale = blocks[..., :2].contiguous().view(torch.float16).float()
    values = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (scale * values).flatten(-2)
