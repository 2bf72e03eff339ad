"""FR draft-head argmax: project hidden rows onto only the first N vocabulary rows and take the argmax.

FR (`spec_mtp_fr_vocab_size`) cuts the draft head to a token-ID prefix; the rows
past N are never read. The Triton kernel fuses the projection with the argmax:
each program scores a fixed chunk of vocabulary rows and keeps its best
(value, index); the shared stage-2 reduction (`power.kernels.argmax`) picks each
row's winner, so no [M, N] logits tensor is written. Scores accumulate in
float32; ties resolve to the lowest token ID.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.argmax import CHUNK, NO_INDEX, argmax_of_partials, keep_best, lowest_best

TILE = 4096  # head entries scored per step: BLOCK_V rows x BLOCK_D columns, BLOCK_D fitted to the head width


def fr_argmax_reference(hidden: torch.Tensor, head_weight: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """hidden [M, d], head_weight [V, d] -> [M] int64 argmax of hidden @ head_weight[:n_prefix].T."""
    return (hidden.float() @ head_weight[:n_prefix].float().T).argmax(dim=-1)


@triton.jit
def _fr_partial_kernel(h_ptr, w_ptr, val_ptr, idx_ptr, N, D, n_chunks, CHUNK: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, NO_INDEX: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    lanes = tl.arange(0, BLOCK_V)
    best_val = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = (start + lanes).to(tl.int64)
    for offset in range(start, tl.minimum(start + CHUNK, N), BLOCK_V):
        vocab = offset + lanes
        score = tl.zeros([BLOCK_V], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            h = tl.load(h_ptr + row * D + ds, mask=ds < D, other=0).to(tl.float32)  # [BLOCK_D]
            w_mask = (vocab < N)[:, None] & (ds < D)[None, :]
            w = tl.load(w_ptr + vocab[:, None].to(tl.int64) * D + ds[None, :], mask=w_mask, other=0)  # [BLOCK_V, BLOCK_D]
            score += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
        score = tl.where(vocab < N, score, float("-inf"))
        best_val, best_idx = keep_best(best_val, best_idx, score, vocab.to(tl.int64))
    top, top_idx = lowest_best(best_val, best_idx, NO_INDEX)
    tl.store(val_ptr + row * n_chunks + chunk, top)
    tl.store(idx_ptr + row * n_chunks + chunk, top_idx)


def fr_argmax_triton(hidden: torch.Tensor, head_weight: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """Same contract as `fr_argmax_reference`: fused chunk scores + argmax, then the shared reduction."""
    rows, width = hidden.shape
    n_chunks = triton.cdiv(n_prefix, CHUNK)
    block_d = min(64, triton.next_power_of_2(width))
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=hidden.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int64, device=hidden.device)
    _fr_partial_kernel[(rows, n_chunks)](hidden, head_weight, vals, idx, n_prefix, width, n_chunks, CHUNK=CHUNK,
                                         BLOCK_V=TILE // block_d, BLOCK_D=block_d, NO_INDEX=NO_INDEX)
    return argmax_of_partials(vals, idx)
