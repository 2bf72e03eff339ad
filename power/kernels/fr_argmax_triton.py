"""The FR draft-head argmax in Triton (`power.kernels.fr_argmax` says what it computes): chunk scores fused with
the argmax, then the shared stage-2 reduction (`power.kernels.argmax_triton`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.argmax_triton import CHUNK, NO_INDEX, argmax_of_partials, keep_best, lowest_best

BLOCK_M, BLOCK_V, MAX_BLOCK_D, NUM_WARPS = 16, 128, 32, 8  # no register spills on sm_90


@triton.jit
def _fr_partial_kernel(h_ptr, w_ptr, val_ptr, idx_ptr, M, N, D, n_chunks, CHUNK: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, NO_INDEX: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    lanes = tl.arange(0, BLOCK_V)
    best_val = tl.full([BLOCK_M, BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.broadcast_to((start + lanes).to(tl.int64)[None, :], [BLOCK_M, BLOCK_V])
    for offset in range(start, tl.minimum(start + CHUNK, N), BLOCK_V):
        vocab = offset + lanes
        score = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            h_mask = (rows < M)[:, None] & (ds < D)[None, :]
            h = tl.load(h_ptr + rows[:, None] * D + ds[None, :], mask=h_mask,
                        other=0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
            w_mask = (ds < D)[:, None] & (vocab < N)[None, :]
            w = tl.load(w_ptr + vocab[None, :].to(tl.int64) * D + ds[:, None], mask=w_mask,
                        other=0)  # [BLOCK_D, BLOCK_V]
            score += tl.dot(h, w.to(tl.float32), input_precision="ieee")
        score = tl.where((vocab < N)[None, :], score, float("-inf"))
        best_val, best_idx = keep_best(best_val, best_idx, score, vocab.to(tl.int64)[None, :])
    top, top_idx = lowest_best(best_val, best_idx, NO_INDEX)  # [BLOCK_M]
    out = rows * n_chunks + chunk
    tl.store(val_ptr + out, top, mask=rows < M)
    tl.store(idx_ptr + out, top_idx, mask=rows < M)


def fr_argmax_triton(hidden: torch.Tensor, head_weight: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """Same contract as `fr_argmax_reference`: fused chunk scores + argmax, then the shared reduction."""
    rows, width = hidden.shape
    n_chunks = triton.cdiv(n_prefix, CHUNK)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=hidden.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int64, device=hidden.device)
    grid = (triton.cdiv(rows, BLOCK_M), n_chunks)
    _fr_partial_kernel[grid](hidden, head_weight, vals, idx, rows, n_prefix, width, n_chunks, CHUNK=CHUNK,
                             BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_D=min(MAX_BLOCK_D,
                                                                           max(16, triton.next_power_of_2(width))),
                             NO_INDEX=NO_INDEX, num_warps=NUM_WARPS)
    return argmax_of_partials(vals, idx)
