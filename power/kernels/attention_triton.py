"""The row-count-invariant attention and cache write in Triton (`power.kernels.attention` says what they compute
and why a row's bits ignore its neighbours); imported only when a kernel runs on Triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.attention import BLOCK_N, tile, warps


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, positions_ptr, capacity, scale, window,
                      GROUP: tl.constexpr, HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    kv = tl.program_id(1)
    n_kv = tl.num_programs(1)
    slot = tl.load(slots_ptr + row)
    position = tl.load(positions_ptr + row)
    real = slot >= 0
    lowest = tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)  # the first cache row the row may read
    first = lowest // BLOCK_N
    last = tl.where(real, position // BLOCK_N + 1, first)  # a padding row visits no block
    g = tl.arange(0, BLOCK_G)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    heads = kv * GROUP + g
    q_rows = q_ptr + (row.to(tl.int64) * n_kv * GROUP + heads[:, None]) * HEAD_K
    q = tl.load(q_rows + dk[None, :], mask=(g < GROUP)[:, None] & (dk < HEAD_K)[None, :], other=0.0).to(tl.float32)
    base = (tl.maximum(slot, 0).to(tl.int64) * n_kv + kv) * capacity  # cache row 0 of this slot and KV head
    peak = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    for block in range(first, last):
        keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + (base + keys[:, None]) * HEAD_K + dk[None, :], mask=(dk < HEAD_K)[None, :],
                    other=0.0).to(tl.float32)  # an f16 / bf16 cache's rows widen exactly
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_G, BLOCK_N]
        allowed = (keys >= lowest) & (keys <= position)
        scores = tl.where(allowed[None, :], scores, float("-inf"))
        new_peak = tl.maximum(peak, tl.max(scores, 1))  # finite: every visited block holds a key the row reads
        rescale = tl.exp(peak - new_peak)
        weights = tl.exp(scores - new_peak[:, None])
        total = total * rescale + tl.sum(weights, 1)
        v = tl.load(v_ptr + (base + keys[:, None]) * HEAD_V + dv[None, :], mask=(dv < HEAD_V)[None, :],
                    other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.dot(weights, v, input_precision="ieee")
        peak = new_peak
    out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a padding row: 0 / 1
    out_rows = out_ptr + (row.to(tl.int64) * n_kv * GROUP + heads[:, None]) * HEAD_V
    tl.store(out_rows + dv[None, :], out, mask=(g < GROUP)[:, None] & (dv < HEAD_V)[None, :])


@triton.jit
def _cache_write_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, positions_ptr, capacity,
                        HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0)
    kv = tl.program_id(1)
    n_kv = tl.num_programs(1)
    slot = tl.load(slots_ptr + row)
    position = tl.load(positions_ptr + row)
    cache_row = (tl.maximum(slot, 0).to(tl.int64) * n_kv + kv) * capacity + position
    source_row = row.to(tl.int64) * n_kv + kv
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    real = (
        tl.zeros([1], tl.int64) + slot
    ) >= 0  # a padding row (slot -1) stores nothing (a [1] mask: the interpreter takes no scalar one)
    k = tl.load(k_ptr + source_row * HEAD_K + dk, mask=dk < HEAD_K)
    v = tl.load(v_ptr + source_row * HEAD_V + dv, mask=dv < HEAD_V)
    tl.store(k_cache_ptr + cache_row * HEAD_K + dk, k, mask=(dk < HEAD_K) & real)
    tl.store(v_cache_ptr + cache_row * HEAD_V + dv, v, mask=(dv < HEAD_V) & real)


def attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """Same contract as `attention_reference`."""
    n, n_heads, head_k = q.shape
    _, n_kv, capacity, head_v = v_cache.shape
    group = n_heads // n_kv
    out = torch.empty(n, n_heads * head_v, dtype=torch.float32, device=q.device)
    _attention_kernel[(n, n_kv)](q, k_cache, v_cache, out, slots, positions, capacity, float(scale), int(window),
                                 GROUP=group, HEAD_K=head_k, HEAD_V=head_v, BLOCK_G=tile(group),
                                 BLOCK_DK=tile(head_k), BLOCK_DV=tile(head_v), BLOCK_N=BLOCK_N,
                                 num_warps=warps(max(head_k, head_v)))
    return out


def cache_write_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slots: torch.Tensor, positions: torch.Tensor) -> None:
    """Same contract as `cache_write_reference`."""
    n, n_kv, head_k = k.shape
    head_v = v.shape[2]
    _cache_write_kernel[(n, n_kv)](k, v, k_cache, v_cache, slots, positions, k_cache.shape[2], HEAD_K=head_k,
                                   HEAD_V=head_v, BLOCK_DK=triton.next_power_of_2(head_k),
                                   BLOCK_DV=triton.next_power_of_2(head_v))
