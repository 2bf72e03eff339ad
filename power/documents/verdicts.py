"""What a bench verdict means, shared by the bench that writes it and the rollout gate that reads it.

Run r of the candidate and run r of the baseline are a pair: the same request, sent one right after the other
(the runs alternate A/B, B/A, ...), so a burst of load from other processes falls on both alike instead of on one
configuration's range. A figure's speedup is the median of the pairs' ratios. The candidate is "faster" when that
median is at least NOISE_BAND above 1 and the sign test's lower bound on it (an order statistic of the ratios, at
CONFIDENCE) is above 1 too; "slower" the other way round; otherwise "no difference" (docs/bench.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from fractions import Fraction
from math import comb

NOISE_BAND = 0.05  # a median ratio within 5 % of 1 is "no difference"
# The bound's one-sided confidence: three pairs that all agree give 7/8; six may hold one pair that disagrees.
CONFIDENCE = Fraction(7, 8)


@dataclass(frozen=True)
class Pairs:
    """One figure's paired runs: the median ratio, the bounds on it (None: too few pairs), how many favour the
    candidate."""

    ratios: tuple[float, ...]
    median: float
    low: float | None
    high: float | None
    faster: int

    @property
    def verdict(self) -> str:
        if self.low is not None and self.median >= 1 + NOISE_BAND and self.low > 1:
            return "faster"
        if self.high is not None and self.median <= 1 - NOISE_BAND and self.high < 1:
            return "slower"
        return "no difference"

    def describe(self) -> str:
        bound = ("too few pairs for a bound" if self.low is None
                 else f"{float(CONFIDENCE):.1%} bound {self.low:.2f}x-{self.high:.2f}x")
        return f"the median of {len(self.ratios)} paired runs' ratios, faster in {self.faster} ({bound})"


def pairs(candidate_runs: list[float], baseline_runs: list[float]) -> Pairs:
    """The candidate's rate over the baseline's, run by run (a run the baseline rated 0 has no ratio)."""
    ratios = sorted(c / b for c, b in zip(candidate_runs, baseline_runs, strict=True) if b > 0)
    if not ratios:
        return Pairs((), 0.0, None, None, 0)
    k = _order_statistic(len(ratios))
    return Pairs(tuple(ratios), statistics.median(ratios), ratios[k - 1] if k else None,
                 ratios[-k] if k else None, sum(ratio > 1 for ratio in ratios))


def _order_statistic(n: int) -> int:
    """The largest k whose k-th smallest of n ratios lies below their median with probability CONFIDENCE or more:
    the median is under it only when fewer than k of the n ratios are, P(Binomial(n, 1/2) < k)."""
    k, below = 0, Fraction(0)
    while k < n:
        below += Fraction(comb(n, k), 2**n)
        if below > 1 - CONFIDENCE:
            break
        k += 1
    return k
