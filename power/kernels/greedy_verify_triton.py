"""Fused greedy verification in Triton (`power.kernels.greedy_verify` says what it computes): a chunked argmax of
the verify rows, then one program for the acceptance.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.argmax_triton import BLOCK_C, NO_INDEX, partial_argmax, reduce_partials


@triton.jit
def _accept_kernel(val_ptr, idx_ptr, proposals_ptr, out_ptr, K, n_chunks, BLOCK_R: tl.constexpr,
                   BLOCK_C: tl.constexpr, NO_INDEX: tl.constexpr):
    rows = tl.arange(0, BLOCK_R)
    ids = reduce_partials(val_ptr, idx_ptr, rows, rows <= K, n_chunks, BLOCK_R, BLOCK_C, NO_INDEX)  # [BLOCK_R]
    proposals = tl.load(proposals_ptr + rows, mask=rows < K, other=-1).to(tl.int64)
    # Row K and the padding rows count as mismatches, so the count never exceeds K.
    stop = (ids != proposals) | (rows >= K)
    accepted = tl.min(tl.where(stop, rows, BLOCK_R), axis=0)
    next_token = tl.sum(tl.where(rows == accepted, ids, 0), axis=0)
    tl.store(out_ptr, accepted.to(tl.int64))
    tl.store(out_ptr + 1, next_token)


def greedy_verify_triton(logits: torch.Tensor, proposals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `greedy_verify_reference`: a chunked argmax, then one program for the acceptance."""
    vals, idx = partial_argmax(logits)
    rows, n_chunks = vals.shape
    out = torch.empty(2, dtype=torch.int64, device=logits.device)
    block_r = max(16, triton.next_power_of_2(rows))
    _accept_kernel[(1,)](vals, idx, proposals, out, rows - 1, n_chunks, BLOCK_R=block_r, BLOCK_C=BLOCK_C,
                         NO_INDEX=NO_INDEX)
    return out[0], out[1]
