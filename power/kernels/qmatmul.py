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
import triton
import triton.language as tl

from power.kernels.dequant import BLOCK_LAYOUT, TRITON_TYPES, dequant_values, dequantize_reference

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
    padded = x.new_zeros(triton.cdiv(rows, BLOCK_M) * BLOCK_M, inner, dtype=torch.float32)
    padded[:rows] = x
    return torch.cat([tile @ w.T for tile in padded.split(BLOCK_M)])[:rows]


@triton.jit
def _qmatmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, row_bytes, PER_BLOCK: tl.constexpr, QTYPE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # K is a whole number of quant blocks and BLOCK_K divides a block, so each step reads one block per column:
    # its scales load once per column ([1, BLOCK_N]) and broadcast over the step's BLOCK_K weights.
    tl.static_assert(PER_BLOCK % BLOCK_K == 0)
    w_rows = w_ptr + cols[None, :].to(tl.int64) * row_bytes  # [1, BLOCK_N]
    w_mask = (cols < N)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows < M)[:, None], other=0).to(tl.float32)
        e = (start % PER_BLOCK + tl.arange(0, BLOCK_K))[:, None]
        w = dequant_values(w_rows, start // PER_BLOCK, e, w_mask, QTYPE)  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(x, w, input_precision="ieee")
    y_mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc, mask=y_mask)


def qmatmul_triton(x: torch.Tensor, weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """Same contract as `qmatmul_reference`; the grid grows with M but every tile runs the same code."""
    rows, inner = x.shape
    n_out, row_bytes = weight.shape
    y = torch.empty(rows, n_out, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(n_out, BLOCK_N))
    code, per_block = CODES[qtype]
    _qmatmul_kernel[grid](x, weight, y, rows, n_out, inner, row_bytes, PER_BLOCK=per_block, QTYPE=code, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                          enable_fp_fusion=False)
    return y
