"""How many proposals a round may ask for: the K/S guard and the adaptive controller.

K (`spec_draft_max`) bounds proposal width; S (`spec_mtp_recurrent_snapshots`)
bounds the target's resident rollback window. With S >= K every proposal has a
rollback point. With S < K (the guarded path) a rejected suffix longer than S
cannot be rewound: the transaction replays once, exactly, from its checkpoint,
and from then on every round of the request is clamped to S proposals.

The adaptive controller (`spec_mtp_adaptive`) is a small per-request state
machine on top of that:

    PROBING --first round fully accepted--> WIDE   (width K)
    PROBING --first round partial---------> NARROW (width min(K, S), for the request)
    any     --`low_yield_rounds` consecutive low-yield rounds--> FALLBACK (width 0, one-way)

Healthy partial rounds keep whatever shape the request has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Shape(str, enum.Enum):
    FIXED = "fixed"  # not adaptive: width K (or S once clamped)
    PROBING = "probing"  # adaptive, before the first round that proposed anything
    WIDE = "wide"
    NARROW = "narrow"
    FALLBACK = "fallback"  # adaptive gave up: target-only for the rest of the request


@dataclass(frozen=True)
class SchedulerConfig:
    k: int  # spec_draft_max
    s: int  # spec_mtp_recurrent_snapshots (the resident window)
    adaptive: bool = False
    low_yield: float = 0.25  # a round accepting less than this fraction of its proposals is low-yield
    low_yield_rounds: int = 3  # this many in a row fall back to the target

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"spec_draft_max (K) must be >= 0, got {self.k}")
        if self.s < 1:
            raise ValueError(f"spec_mtp_recurrent_snapshots (S) must be >= 1, got {self.s}")
        if self.low_yield_rounds < 1:
            raise ValueError(f"low_yield_rounds must be >= 1, got {self.low_yield_rounds}")

    @property
    def guarded(self) -> bool:
        return self.s < self.k


class Scheduler:
    """One request's proposal width: call `width()` before a round and `record()` after it."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.shape = Shape.PROBING if config.adaptive else Shape.FIXED
        self.clamped = False
        self.clamps = 0
        self.fallbacks = 0
        self._low_yield_run = 0

    def width(self) -> int:
        k, s = self.config.k, self.config.s
        if self.shape is Shape.FALLBACK:
            return 0
        if self.shape in (Shape.PROBING, Shape.NARROW):
            return min(k, s)
        return min(k, s) if self.clamped else k

    def record(self, proposed: int, accepted: int, replayed: bool) -> None:
        """Account one round: what was proposed, how much of it was accepted, whether it needed a replay."""
        if replayed and not self.clamped:
            self.clamped = True
            self.clamps += 1
        if proposed == 0 or not self.config.adaptive or self.shape is Shape.FALLBACK:
            return
        if self.shape is Shape.PROBING:
            self.shape = Shape.WIDE if accepted == proposed else Shape.NARROW
        if accepted < self.config.low_yield * proposed:
            self._low_yield_run += 1
        else:
            self._low_yield_run = 0
        if self._low_yield_run >= self.config.low_yield_rounds:
            self.shape = Shape.FALLBACK
            self.fallbacks += 1
