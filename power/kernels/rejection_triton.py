"""Rejection-sampling verification in Triton (`power.kernels.rejection` says what it computes and how the fixed-point
draw makes a parallel scan agree with a sequential one): block sums in parallel, then one drawing program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from power.kernels.rejection import ACCEPT, LANES, RESIDUAL, SAMPLE, UNIFORM_BITS, WEIGHT_BITS

BLOCK_V = 1024  # tokens per pass-1 program
BLOCK_B = 256  # block sums read per pass-2 step

@triton.jit
def _accepted(p_ptr, q_ptr, proposals_ptr, u_ptr, K, V, BLOCK_K: tl.constexpr, LANES: tl.constexpr,
              ACCEPT: tl.constexpr):
    """The number of leading proposals kept: q(x) > 0 and u * q(x) < p(x), in float64."""
    i = tl.arange(0, BLOCK_K)
    live = i < K
    x = tl.load(proposals_ptr + i, mask=live, other=0).to(tl.int64)
    p = tl.load(p_ptr + i * V + x, mask=live, other=0).to(tl.float64)
    q = tl.load(q_ptr + i * V + x, mask=live, other=0).to(tl.float64)
    u = tl.load(u_ptr + i * LANES + ACCEPT, mask=live, other=1).to(tl.float64)
    kept = (q > 0) & (u * q < p)
    return tl.min(tl.where(live & ~kept, i, K), axis=0).to(tl.int64)


@triton.jit
def _fixed_weights(p_ptr, q_ptr, idx, V, q_len, WEIGHT_SCALE: tl.constexpr):
    """floor(max(p - q, 0) * 2^36) and floor(p * 2^36) as int64 at idx; q reads as 0 from q_len on, all 0 past V."""
    p = tl.load(p_ptr + idx, mask=idx < V, other=0).to(tl.float64)
    q = tl.load(q_ptr + idx, mask=idx < q_len, other=0).to(tl.float64)
    return (tl.maximum(p - q, 0.0) * WEIGHT_SCALE).to(tl.int64), (p * WEIGHT_SCALE).to(tl.int64)


@triton.jit
def _block_sums_kernel(p_ptr, q_ptr, proposals_ptr, u_ptr, sums_ptr, K, V, n_blocks,
                       BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, LANES: tl.constexpr, ACCEPT: tl.constexpr,
                       WEIGHT_SCALE: tl.constexpr):
    """Pass 1, one program per BLOCK_V tokens: the block's fixed-point residual and target sums."""
    block = tl.program_id(0)
    accepted = _accepted(p_ptr, q_ptr, proposals_ptr, u_ptr, K, V, BLOCK_K, LANES, ACCEPT)
    q_len = tl.where(accepted < K, V, 0)  # the bonus row has no draft row: q reads as 0
    idx = block * BLOCK_V + tl.arange(0, BLOCK_V)
    residual, target = _fixed_weights(p_ptr + accepted * V, q_ptr + accepted * V, idx, V, q_len, WEIGHT_SCALE)
    tl.store(sums_ptr + block, tl.sum(residual, axis=0))
    tl.store(sums_ptr + n_blocks + block, tl.sum(target, axis=0))


@triton.jit
def _draw_kernel(p_ptr, q_ptr, proposals_ptr, u_ptr, sums_ptr, out_ptr, K, V, n_blocks,
                 BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr, LANES: tl.constexpr,
                 SAMPLE: tl.constexpr, ACCEPT: tl.constexpr, RESIDUAL: tl.constexpr,
                 WEIGHT_SCALE: tl.constexpr, UNIFORM_BITS: tl.constexpr):
    """Pass 2, one program: the totals, the block the draw lands in, then the token inside that block."""
    accepted = _accepted(p_ptr, q_ptr, proposals_ptr, u_ptr, K, V, BLOCK_K, LANES, ACCEPT)
    rejected = accepted < K
    lanes = tl.arange(0, BLOCK_B)
    residual_total = accepted * 0
    target_total = accepted * 0
    for offset in range(0, n_blocks, BLOCK_B):
        live = offset + lanes < n_blocks
        residual_total += tl.sum(tl.load(sums_ptr + offset + lanes, mask=live, other=0), axis=0)
        target_total += tl.sum(tl.load(sums_ptr + n_blocks + offset + lanes, mask=live, other=0), axis=0)
    use_residual = rejected & (residual_total > 0)  # an empty residual draws from p itself
    total = tl.where(use_residual, residual_total, target_total)
    sums = sums_ptr + tl.where(use_residual, 0, n_blocks)

    lane = tl.where(rejected, RESIDUAL, SAMPLE)
    u_draw = tl.load(u_ptr + accepted * LANES + lane).to(tl.float64)
    u_fixed = tl.minimum(tl.maximum((u_draw * (1 << UNIFORM_BITS)).to(tl.int64), 0), (1 << UNIFORM_BITS) - 1)
    threshold = (u_fixed * total) >> UNIFORM_BITS

    # Cumulative sums only grow, so the blocks that end at or below the threshold are a prefix.
    full_blocks = accepted * 0
    before = accepted * 0
    running = accepted * 0
    for offset in range(0, n_blocks, BLOCK_B):
        block_sum = tl.load(sums + offset + lanes, mask=offset + lanes < n_blocks, other=0)
        below = (tl.cumsum(block_sum, axis=0) + running <= threshold) & (offset + lanes < n_blocks)
        full_blocks += tl.sum(below.to(tl.int64), axis=0)
        before += tl.sum(tl.where(below, block_sum, 0), axis=0)
        running += tl.sum(block_sum, axis=0)
    block = tl.minimum(full_blocks, n_blocks - 1)

    idx = block * BLOCK_V + tl.arange(0, BLOCK_V)
    q_len = tl.where(use_residual, V, 0)
    residual, target = _fixed_weights(p_ptr + accepted * V, q_ptr + accepted * V, idx, V, q_len, WEIGHT_SCALE)
    weights = tl.where(use_residual, residual, target)
    below = (tl.cumsum(weights, axis=0) + before <= threshold) & (idx < V)
    token = tl.minimum(block * BLOCK_V + tl.sum(below.to(tl.int64), axis=0), V - 1)
    tl.store(out_ptr, accepted)
    tl.store(out_ptr + 1, token)


def rejection_step_triton(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, proposals: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract and result as `rejection_step_reference`: parallel block sums, then one drawing program."""
    k = proposals.numel()
    vocab = target_probs.shape[1]
    n_blocks = triton.cdiv(vocab, BLOCK_V)
    sums = torch.empty(2, n_blocks, dtype=torch.int64, device=target_probs.device)  # residual, target
    out = torch.empty(2, dtype=torch.int64, device=target_probs.device)
    shared = dict(BLOCK_K=max(16, triton.next_power_of_2(k)), BLOCK_V=BLOCK_V, LANES=LANES, ACCEPT=ACCEPT,
                  WEIGHT_SCALE=float(2**WEIGHT_BITS))
    _block_sums_kernel[(n_blocks,)](target_probs, draft_probs, proposals, uniforms, sums, k, vocab, n_blocks, **shared)
    _draw_kernel[(1,)](target_probs, draft_probs, proposals, uniforms, sums, out, k, vocab, n_blocks,
                       BLOCK_B=BLOCK_B, SAMPLE=SAMPLE, RESIDUAL=RESIDUAL, UNIFORM_BITS=UNIFORM_BITS, **shared)
    return out[0], out[1]
