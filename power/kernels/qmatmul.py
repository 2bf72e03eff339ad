"""Batch-invariant small-M quantised matmul: y[M, N] = x[M, K] @ dequant(W[N, K]).T in float32.

Batch invariance means row i of the result depends only on x[i] and W, never on
how many rows ran beside it, so `qmatmul(x[:1]) == qmatmul(x)[:1]` bit for bit.
Both paths get it the same way: one fixed tile configuration and one reduction
order whatever M - no split-K and no dispatch on M. The Triton kernel
dequantises W tile by tile in registers (weights stay packed in memory) and
accumulates BLOCK_K-wide slices in a fixed order; the reference dequantises W
and multiplies fixed 16-row tiles (x padded with zero rows), since the same
matmul shape performs the same arithmetic on each row. F16 matrices are read
the same way, 32 weights a step, so no matrix the runtime keeps on a GPU needs a
float32 copy unless its rows are not a multiple of 32 weights.
"""

from __future__ import annotations

import torch

from power.kernels.dequant import BLOCK_LAYOUT, TRITON_TYPES, dequantize_reference

BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32  # the largest tile that compiles without register spills on sm_90
# GGML type -> (the kernel's type code, weights per step of its reduction): a quant block, or for F16 (no blocks) one
# BLOCK_K-wide slice, so F16 matrices stay 2 bytes a weight on a GPU too.
CODES: dict[str, tuple[int, int]] = {qtype: (code, BLOCK_LAYOUT[qtype][0]) for qtype, code in TRITON_TYPES.items()}
CODES["F16"] = (6, BLOCK_K)
SUPPORTED = tuple(CODES)


def step_size(qtype: str) -> int:
    """How many weights a row's length must be a multiple of for the kernel to read `qtype`."""
    return CODES[qtype][1]


def qmatmul_reference(x: torch.Tensor, weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """x [M, K] float, weight [N, row_bytes] uint8 (GGUF rows) -> [M, N] float32."""
    rows, inner = x.shape
    w = dequantize_reference(qtype, weight.reshape(-1), (weight.shape[0], inner))
    padded = x.new_zeros(-(-rows // BLOCK_M) * BLOCK_M, inner, dtype=torch.float32)
    padded[:rows] = x
    return torch.cat([tile @ w.T for tile in padded.split(BLOCK_M)])[:rows]
