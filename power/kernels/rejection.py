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
are compared in float64 whatever their input dtype. It is the runtime's one
draw: a plain token is a step with no proposals (`dispatch.draw`).

Uniform columns follow `power.runtime.sampling.Lane`: one row per emitted position.
"""

from __future__ import annotations

import torch

SAMPLE, ACCEPT, RESIDUAL = 0, 1, 2  # the column order of power.runtime.sampling.Lane
LANES = 3
WEIGHT_BITS = 36
UNIFORM_BITS = 24


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
