"""The batch-invariant quantised matmul in Triton (`power.kernels.qmatmul` says what it computes and why a row's
result ignores its neighbours): W dequantised tile by tile in registers, BLOCK_K-wide slices summed in order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.dequant_triton import dequant_values
from power.kernels.qmatmul import BLOCK_K, BLOCK_M, BLOCK_N, CODES


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
    _qmatmul_kernel[grid](x, weight, y, rows, n_out, inner, row_bytes, PER_BLOCK=per_block, QTYPE=code, BLOCK_M=BLOCK_M,
                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                          enable_fp_fusion=False)
    return y
