"""Row-count-invariant attention over a slotted KV cache, and the cache write before it.

Each query row attends to its own sequence's cache: the slot `slots[i]` (a
sequence of the trunk; -1 marks a padding row, which reads and writes nothing and
gives zeros) at position `positions[i]`, reading cache rows j with j <= p and,
for a sliding-window layer, p - j < window (llama.cpp's LLAMA_SWA_TYPE_STANDARD).
Grouped-query attention: query head h reads KV head h // G.

Row-count invariance by construction: one program per (query row, KV head),
whose arithmetic depends only on that row's query, position and slot. It walks
the cache in fixed BLOCK_N-slot blocks from the first block the row may read to
the block holding its own position, in slot order, with an online softmax in
float32 (running maximum, rescaled exponential sum and value accumulator;
Milakov & Gimelshein 2018, as in FlashAttention, Dao et al. 2022). The tiles,
the block size and the order never depend on how many rows the call has: only
the grid grows with the rows. No argument of the kernel carries the row count,
so Triton's specialisation of integer arguments (1, multiples of 16) cannot give
a one-row call other code either. Positions and slots are read from device
tensors, so a captured CUDA graph replays the same launch for new positions.

The torch references are plain attention, one row at a time over the whole
cache (a fixed shape per row, so they too are row-count invariant on the CPU);
they are the oracles and what the CPU runs when the GPU path is forced there.

Accuracy (checked in tests/test_kernel_attention.py against float64): with
u = 2^-24, gamma_m = m u / (1 - m u) (Higham, Accuracy and Stability of
Numerical Algorithms, 2nd ed., Lemma 3.1), a row reading T cache rows in nb
blocks computes each score s_j = scale q.k_j within
D = (gamma_dk + u) scale max_j |q|.|k_j| (any summation order). Moving every
score by at most D moves each softmax weight by a factor within exp(+-2 D); the
exponentials, the per-block rescaling (the same factor on the sum and on the
accumulator) and the weighted sum of at most T values add at most
(3 T + 8 nb + 16) u relative to max_j |v_j|, to first order (an exponential's
argument rounding costs |x| u of a weight exp(x) <= 1, at most u / e each). So
|o - o_exact| <= (2.2 D + (3 T + 8 nb + 16) u) max_j |v_j| per output element,
the tolerance `attention_bound` computes.
"""

from __future__ import annotations

import torch

BLOCK_N = 32  # cache rows per step of the online softmax: one block size for every call
MIN_TILE = 16  # tl.dot's smallest tile side on the GPU
WIDE_HEAD = 256  # from this head width on, 8 warps: 4 spill registers on sm_90 at width 512, or 256 with 8 query heads


def tile(width: int) -> int:
    """A block side: the next power of two, at least MIN_TILE."""
    return max(MIN_TILE, 1 << (width - 1).bit_length())


def warps(head_width: int) -> int:
    """Warps per program: fixed by the layer's head width, never by the number of rows."""
    return 8 if head_width >= WIDE_HEAD else 4


def attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                        positions: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """q [n, H, dk]; k_cache [S, Hkv, T, dk], v_cache [S, Hkv, T, dv]; slots, positions [n] int64 (slot -1: a
    padding row); window 0 for a global layer -> [n, H * dv] float32."""
    n, n_heads, _ = q.shape
    _, n_kv, capacity, _ = k_cache.shape
    group = n_heads // n_kv
    keys = torch.arange(capacity, device=q.device)
    out = q.new_zeros(n, n_heads, v_cache.shape[-1], dtype=torch.float32)
    for row in range(n):
        slot, position = slots[row].clamp(min=0).reshape(1), positions[row]
        k, v = k_cache.index_select(0, slot)[0].float(), v_cache.index_select(0, slot)[0].float()  # [Hkv, T, d]
        scores = torch.bmm(q[row].float().reshape(n_kv, group, -1), k.transpose(1, 2)) * scale  # [Hkv, G, T]
        allowed = keys <= position
        if window:
            allowed &= keys > position - window
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        values = torch.bmm(weights, v).reshape(n_heads, -1)
        out[row] = torch.where(slots[row] >= 0, values, torch.zeros_like(values))
    return out.reshape(n, -1)


def cache_write_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slots: torch.Tensor, positions: torch.Tensor) -> None:
    """k [n, Hkv, dk], v [n, Hkv, dv] into k_cache/v_cache [S, Hkv, T, d] at (slots[i], positions[i]); a padding
    row (slot -1) writes nothing."""
    for row in range(k.shape[0]):  # indices as 1-element tensors: no value crosses to the host
        slot, position, real = slots[row:row + 1].clamp(min=0), positions[row:row + 1], slots[row] >= 0
        for cache, new in ((k_cache, k), (v_cache, v)):
            cache[slot, :, position] = torch.where(real, new[row:row + 1], cache[slot, :, position])


def attention_bound(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    positions: torch.Tensor, scale: float, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the exact attention in float64, the tolerance of the module docstring), both [n, H * dv]: the oracle the tests
    and `scripts/gpu-check` hold both paths to."""
    n, n_heads, head_k = q.shape
    _, n_kv, capacity, _ = k_cache.shape
    group = n_heads // n_kv
    u = 2.0**-24
    gamma = head_k * u / (1 - head_k * u)
    keys = torch.arange(capacity, device=q.device)
    exact = torch.zeros(n, n_heads, v_cache.shape[-1], dtype=torch.float64, device=q.device)
    bound = torch.zeros_like(exact)
    for row in range(n):
        if int(slots[row]) < 0:
            continue
        position, slot = int(positions[row]), int(slots[row])
        lowest = max(position - window + 1, 0) if window else 0
        readable = (keys >= lowest) & (keys <= position)
        k, v = k_cache[slot].double(), v_cache[slot].double()  # [Hkv, T, d]
        qs = q[row].double().reshape(n_kv, group, -1)
        scores = torch.bmm(qs, k.transpose(1, 2)) * scale
        exact[row] = torch.bmm(torch.softmax(scores.masked_fill(~readable, float("-inf")), -1), v).reshape(n_heads, -1)
        magnitude = (torch.bmm(qs.abs(), k.abs().transpose(1, 2)) * scale)[..., readable].amax(-1)  # [Hkv, G]
        largest_v = v.abs()[:, readable].amax(1)  # [Hkv, dv]
        reads, blocks = int(readable.sum()), position // BLOCK_N - lowest // BLOCK_N + 1
        relative = 2.2 * (gamma + u) * magnitude + (3 * reads + 8 * blocks + 16) * u  # [Hkv, G]
        bound[row] = (relative[..., None] * largest_v[:, None, :]).reshape(n_heads, -1)
    return exact.reshape(n, -1), bound.reshape(n, -1)
