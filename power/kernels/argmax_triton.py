"""Row argmax in two deterministic stages, shared by greedy verify and FR argmax.

Stage 1 splits each row into fixed chunks of `CHUNK` entries and writes one
(max, index) partial per chunk; stage 2 reduces a row's partials. Chunk size and
reduction order never depend on the input, so the same row always yields the
same index. Ties resolve to the lowest index, torch.argmax's rule: within a lane
a later entry replaces the best only when strictly greater, and across lanes and
chunks the lowest index among the equal maxima wins. NaN entries are not
supported (the runtime never produces NaN logits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096  # entries per stage-1 program
BLOCK = 1024  # entries loaded per stage-1 step
BLOCK_C = 64  # partials loaded per stage-2 step
BLOCK_R = 16  # rows per stage-2 program
NO_INDEX = 2**62


@triton.jit
def keep_best(best_val, best_idx, val, idx):
    """Lane-wise running argmax: a later entry wins only when strictly greater."""
    better = val > best_val
    return tl.where(better, val, best_val), tl.where(better, idx, best_idx)


@triton.jit
def lowest_best(best_val, best_idx, NO_INDEX: tl.constexpr):
    """Reduce lanes (last axis) to the maximum and the lowest index holding it."""
    top = tl.max(best_val, axis=-1)
    is_top = best_val == tl.expand_dims(top, -1)
    return top, tl.min(tl.where(is_top, best_idx, NO_INDEX), axis=-1)


@triton.jit
def _partial_argmax_kernel(
    x_ptr, val_ptr, idx_ptr, V, n_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NO_INDEX: tl.constexpr
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    lanes = tl.arange(0, BLOCK)
    # Seeding the lanes with the chunk's first entries keeps an all -inf chunk at its lowest index.
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = (start + lanes).to(tl.int64)
    for offset in range(start, tl.minimum(start + CHUNK, V), BLOCK):
        idx = offset + lanes
        val = tl.load(x_ptr + row.to(tl.int64) * V + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        best_val, best_idx = keep_best(best_val, best_idx, val, idx.to(tl.int64))
    top, top_idx = lowest_best(best_val, best_idx, NO_INDEX)
    tl.store(val_ptr + row * n_chunks + chunk, top)
    tl.store(idx_ptr + row * n_chunks + chunk, top_idx)


@triton.jit
def reduce_partials(val_ptr, idx_ptr, rows, row_mask, n_chunks, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                    NO_INDEX: tl.constexpr):
    """Stage 2 for a tile of BLOCK_R rows: the argmax index of each row from its [n_chunks] partials."""
    lanes = tl.arange(0, BLOCK_C)
    best_val = tl.full([BLOCK_R, BLOCK_C], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_R, BLOCK_C], NO_INDEX, tl.int64)
    for offset in range(0, n_chunks, BLOCK_C):
        chunk = offset + lanes
        where = rows[:, None] * n_chunks + chunk[None, :]
        mask = row_mask[:, None] & (chunk < n_chunks)[None, :]
        val = tl.load(val_ptr + where, mask=mask, other=float("-inf"))
        idx = tl.load(idx_ptr + where, mask=mask, other=NO_INDEX)
        # Chunks hold disjoint, increasing index ranges, so ties between partials need the index test too.
        better = (val > best_val) | ((val == best_val) & (idx < best_idx))
        best_val = tl.where(better, val, best_val)
        best_idx = tl.where(better, idx, best_idx)
    _, top_idx = lowest_best(best_val, best_idx, NO_INDEX)
    return top_idx


@triton.jit
def _argmax_of_partials_kernel(val_ptr, idx_ptr, out_ptr, R, n_chunks, BLOCK_R: tl.constexpr,
                               BLOCK_C: tl.constexpr, NO_INDEX: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < R
    ids = reduce_partials(val_ptr, idx_ptr, rows, row_mask, n_chunks, BLOCK_R, BLOCK_C, NO_INDEX)
    tl.store(out_ptr + rows, ids, mask=row_mask)


def partial_argmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1: [R, V] -> per-chunk maxima [R, C] float32 and their indices [R, C] int64."""
    rows, vocab = x.shape
    n_chunks = triton.cdiv(vocab, CHUNK)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int64, device=x.device)
    _partial_argmax_kernel[(rows, n_chunks)](x, vals, idx, vocab, n_chunks, CHUNK=CHUNK, BLOCK=BLOCK, NO_INDEX=NO_INDEX)
    return vals, idx


def argmax_of_partials(vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Stage 2: [R, C] partials -> [R] int64 row argmax."""
    rows, n_chunks = vals.shape
    out = torch.empty(rows, dtype=torch.int64, device=vals.device)
    grid = (triton.cdiv(rows, BLOCK_R),)
    _argmax_of_partials_kernel[grid](vals, idx, out, rows, n_chunks, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C,
                                     NO_INDEX=NO_INDEX)
    return out

