"""Rejection-sampling verification (Leviathan et al. 2023; Chen et al. 2023), deterministic given its uniforms.

For proposal i (drawn by the drafter from q_i) the target keeps it when
q_i(x) > 0 and u_accept * q_i(x) < p_i(x), i.e. with probability min(1, p/q). At
the first rejection the correction is drawn from norm(max(0, p_i - q_i)) (from
p_i itself if that residual is empty: p == q, where a rejection cannot happen in
exact arithmetic); when all K are kept the bonus token is drawn from p_K.

The draw is an inverse CDF in token-ID order carried out in fixed point, so that
a parallel scan and a sequential one give the same token: each weight becomes
floor(w * 2^36) as int64 (integer sums are exact in any order), the uniform
becomes floor(u * 2^24), and the token is the first whose cumulative weight
exceeds floor(u_int * total / 2^24). Weights below 2^-36 are dropped: at most
V * 2^-36 (4e-6 for a 262,144 vocabulary) of probability mass. Probabilities
are compared in float64 whatever their input dtype.

Uniform columns follow `power.runtime.sampling.Lane`: one row per emitted position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SAMPLE, ACCEPT, RESIDUAL = 0, 1, 2  # the column order of power.runtime.sampling.Lane
LANES = 3
WEIGHT_BITS = 36
UNIFORM_BITS = 24
BLOCK_V = 1024


def _fixed_uniform(u: torch.Tensor) -> torch.Tensor:
    return (u.double() * 2**UNIFORM_BITS).to(torch.int64).clamp(0, 2**UNIFORM_BITS - 1)


def _fixed_draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw over float64 weights [V] with the uniform u (0-d): a 0-d int64 token."""
    fixed = (weights * 2**WEIGHT_BITS).to(torch.int64)
    threshold = (_fixed_uniform(u) * fixed.sum()) >> UNIFORM_BITS
    return (fixed.cumsum(dim=0) <= threshold).sum().clamp(max=weights.numel() - 1)


def rejection_step_reference(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, proposals: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_probs [K+1, V], draft_probs [K, V], proposals [K], uniforms [K+1, 3] -> (accepted, next token)."""
    k = proposals.numel()
    rows = torch.arange(k, device=proposals.device)
    p = target_probs[rows, proposals].double()
    q = draft_probs[rows, proposals].double()
    kept = (q > 0) & (uniforms[:k, ACCEPT].double() * q < p)
    accepted = kept.to(torch.int64).cumprod(dim=0).sum()
    if int(accepted) == k:
        return accepted, _fixed_draw(target_probs[k].double(), uniforms[k, SAMPLE])
    p_row = target_probs[accepted].double()
    residual = (p_row - draft_probs[accepted].double()).clamp(min=0)
    if int((residual * 2**WEIGHT_BITS).to(torch.int64).sum()) == 0:
        residual = p_row
    return accepted, _fixed_draw(residual, uniforms[accepted, RESIDUAL])


@triton.jit
def _fixed_weights(p_ptr, q_ptr, idx, V, q_len, WEIGHT_SCALE: tl.constexpr):
    """floor(max(p - q, 0) * 2^36) as int64 for the entries idx; q reads as 0 from q_len on, and all is 0 past V."""
    p = tl.load(p_ptr + idx, mask=idx < V, other=0).to(tl.float64)
    q = tl.load(q_ptr + idx, mask=idx < q_len, other=0).to(tl.float64)
    return (tl.maximum(p - q, 0.0) * WEIGHT_SCALE).to(tl.int64)


@triton.jit
def _fixed_total(p_ptr, q_ptr, V, q_len, BLOCK_V: tl.constexpr, WEIGHT_SCALE: tl.constexpr):
    total = tl.zeros([BLOCK_V], tl.int64)
    for offset in range(0, V, BLOCK_V):
        total += _fixed_weights(p_ptr, q_ptr, offset + tl.arange(0, BLOCK_V), V, q_len, WEIGHT_SCALE)
    return tl.sum(total, axis=0)


@triton.jit
def _rejection_kernel(p_ptr, q_ptr, proposals_ptr, u_ptr, out_ptr, K, V,
                      BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, LANES: tl.constexpr,
                      SAMPLE: tl.constexpr, ACCEPT: tl.constexpr, RESIDUAL: tl.constexpr,
                      WEIGHT_SCALE: tl.constexpr, UNIFORM_BITS: tl.constexpr):
    i = tl.arange(0, BLOCK_K)
    live = i < K
    x = tl.load(proposals_ptr + i, mask=live, other=0).to(tl.int64)
    p = tl.load(p_ptr + i * V + x, mask=live, other=0).to(tl.float64)
    q = tl.load(q_ptr + i * V + x, mask=live, other=0).to(tl.float64)
    u = tl.load(u_ptr + i * LANES + ACCEPT, mask=live, other=1).to(tl.float64)
    kept = (q > 0) & (u * q < p)
    accepted = tl.min(tl.where(live & ~kept, i, K), axis=0).to(tl.int64)

    rejected = accepted < K
    p_row = p_ptr + accepted * V
    q_row = q_ptr + accepted * V
    q_len = tl.where(rejected, V, 0)  # the bonus row has no draft row: q reads as 0
    total = _fixed_total(p_row, q_row, V, q_len, BLOCK_V, WEIGHT_SCALE)
    if total == 0:  # empty residual: draw from p itself
        q_len = 0 * q_len
        total = _fixed_total(p_row, q_row, V, q_len, BLOCK_V, WEIGHT_SCALE)

    lane = tl.where(rejected, RESIDUAL, SAMPLE)
    u_draw = tl.load(u_ptr + accepted * LANES + lane).to(tl.float64)
    u_fixed = tl.minimum(tl.maximum((u_draw * (1 << UNIFORM_BITS)).to(tl.int64), 0), (1 << UNIFORM_BITS) - 1)
    threshold = (u_fixed * total) >> UNIFORM_BITS

    below = tl.zeros([BLOCK_V], tl.int64)
    carry = total * 0
    for offset in range(0, V, BLOCK_V):
        idx = offset + tl.arange(0, BLOCK_V)
        fixed = _fixed_weights(p_row, q_row, idx, V, q_len, WEIGHT_SCALE)
        cumulative = tl.cumsum(fixed, axis=0) + carry
        below += ((cumulative <= threshold) & (idx < V)).to(tl.int64)
        carry += tl.sum(fixed, axis=0)
    token = tl.minimum(tl.sum(below, axis=0), V - 1)
    tl.store(out_ptr, accepted)
    tl.store(out_ptr + 1, token)


def rejection_step_triton(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, proposals: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract and result as `rejection_step_reference`, in one program on the device."""
    k = proposals.numel()
    vocab = target_probs.shape[1]
    out = torch.empty(2, dtype=torch.int64, device=target_probs.device)
    _rejection_kernel[(1,)](
        target_probs, draft_probs, proposals, uniforms, out, k, vocab,
        BLOCK_K=max(16, triton.next_power_of_2(k)), BLOCK_V=BLOCK_V, LANES=LANES,
        SAMPLE=SAMPLE, ACCEPT=ACCEPT, RESIDUAL=RESIDUAL,
        WEIGHT_SCALE=float(2**WEIGHT_BITS), UNIFORM_BITS=UNIFORM_BITS,
    )
    return out[0], out[1]
