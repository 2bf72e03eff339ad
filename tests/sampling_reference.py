"""A float64 reference for the runtime's draws, written the plain way: the tests' oracle, not the runtime's path.

The runtime draws every non-greedy token in fixed point (`power.kernels.dispatch.draw`, the rejection kernel's
draw); this one cumulates in float64. The two agree except when a uniform falls within about 2^-24 of a CDF
boundary.
"""

from __future__ import annotations

import torch


def draw(probs: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw in token-ID order: the first token whose cumulative mass exceeds u * total."""
    cdf = torch.cumsum(probs.to(torch.float64), dim=0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    index = min(index, probs.numel() - 1)
    while probs[index] <= 0:  # u * total landed exactly on a zero-mass boundary
        index -= 1
    return index


def accept(p: torch.Tensor, q: torch.Tensor, token: int, u: float) -> bool:
    """Rejection rule: keep proposal `token` (drawn from q) with probability min(1, p/q)."""
    q_token = float(q[token])
    if q_token <= 0.0:  # a token the drafter could not have drawn: never accepted
        return False
    return u < float(p[token]) / q_token


def correct(p: torch.Tensor, q: torch.Tensor, u: float) -> int:
    """Rejection rule: the correction after a rejected proposal, drawn from norm(max(0, p - q))."""
    residual = torch.clamp(p.to(torch.float64) - q.to(torch.float64), min=0.0)
    if float(residual.sum()) <= 0.0:  # p == q: a rejection cannot happen; fall back to p itself
        residual = p.to(torch.float64)
    return draw(residual, u)
