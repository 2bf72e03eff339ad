"""The decode loop: rounds of the exactness transaction, sized by the scheduler, gated by the governor.

Plain (autoregressive) decoding is this loop with no speculator: every round is
a zero-proposal round through the same transaction, the same fixed-shape target
forward and the same sampler. That is what makes a greedy speculative stream
bit-identical to the plain one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Collection, Sequence

from power.runtime.trunks.protocol import Trunk

from .governor import CostGovernor
from .receipt import SpeculationRates
from .sampling import Sampler
from .scheduler import Scheduler, SchedulerConfig
from .speculators.base import Speculator
from .transaction import Cancelled, RoundResult, SpeculativeSequence, StepObserver


@dataclass
class SpeculationStats(SpeculationRates):
    """The receipt's speculation counters for one request (add them up across requests)."""

    rounds: int = 0  # transactions run (plain and speculative)
    speculative_rounds: int = 0  # rounds that verified at least one proposal
    proposed: int = 0
    accepted: int = 0
    replays: int = 0  # exact replays (rejected suffix outside the resident window)
    clamps: int = 0  # requests clamped to S after a replay
    fallbacks: int = 0  # one-way adaptive fallbacks to the target
    governor_parks: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def add_round(self, result: RoundResult) -> None:
        self.rounds += 1
        self.speculative_rounds += result.proposed > 0
        self.proposed += result.proposed
        self.accepted += result.accepted
        self.replays += result.replayed

    def to_json(self) -> dict[str, object]:
        return asdict(self) | {"acceptance": self.acceptance, "mean_accepted_length": self.mean_accepted_length}


@dataclass
class Generation:
    tokens: list[int]  # emitted token IDs (prompt excluded)
    stats: SpeculationStats
    stopped: bool = False  # ended on a stop token (the engine also sets it for a stop string)
    cancelled: bool = False  # cancelled mid-round (that round rolled back)
    sequence: SpeculativeSequence | None = field(default=None, repr=False)


class Decoder:
    """Decodes requests on one trunk with an optional speculator (None: plain decoding)."""

    def __init__(
        self,
        trunk: Trunk,
        sampler: Sampler,
        speculator: Speculator | None = None,
        schedule: SchedulerConfig | None = None,
        governor: CostGovernor | None = None,
    ) -> None:
        self.trunk = trunk
        self.sampler = sampler
        self.speculator = speculator
        self.schedule = schedule or SchedulerConfig(k=0, s=max(1, trunk.config.snapshot_rows))
        self.governor = governor

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        stop_ids: Collection[int] = (),
        cancel: threading.Event | None = None,
        observer: StepObserver | None = None,
        finish: threading.Event | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Generation:
        """Decode up to `max_new_tokens` after `prompt`, ending early on a token in `stop_ids`.

        Setting `cancel` (from any thread) ends the request at the next step boundary with the open round
        rolled back. Setting `finish` ends it after the round in hand commits, as a normal end: the caller's
        own stop condition (a stop string), with nothing rolled back. `on_tokens` receives each committed
        round's emitted tokens (the prefill's first token included) as they land.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        stats = SpeculationStats()
        seq = SpeculativeSequence(self.trunk, self.sampler, self.speculator, stop_ids, cancel, observer)
        scheduler = Scheduler(self.schedule)
        parks_before = self.governor.parks if self.governor else 0
        if self.governor:
            self.governor.new_request()
        started = time.perf_counter()
        first = seq.start(prompt)
        stats.prefill_s = time.perf_counter() - started
        generation = Generation([first], stats, stopped=first in seq.stop_ids, sequence=seq)
        if on_tokens:
            on_tokens([first])
        try:
            while not generation.stopped and not (finish and finish.is_set()) and len(seq.emitted) < max_new_tokens:
                emitted = self._round(seq, scheduler, stats, max_new_tokens - len(seq.emitted))
                if on_tokens:
                    on_tokens(emitted)
                generation.stopped = seq.tokens[-1] in seq.stop_ids
        except Cancelled:
            generation.cancelled = True
        stats.decode_s = time.perf_counter() - started - stats.prefill_s
        stats.clamps, stats.fallbacks = scheduler.clamps, scheduler.fallbacks
        stats.governor_parks = (self.governor.parks - parks_before) if self.governor else 0
        generation.tokens = seq.emitted
        return generation

    def _round(self, seq: SpeculativeSequence, scheduler: Scheduler, stats: SpeculationStats, remaining: int) -> list[int]:
        speculate = self.speculator is not None and (self.governor is None or self.governor.speculate())
        width = min(scheduler.width(), remaining - 1) if speculate else 0
        started = time.perf_counter()
        result = seq.round(width)
        seconds = time.perf_counter() - started
        stats.add_round(result)
        scheduler.record(result.proposed, result.accepted, result.replayed)
        if self.governor:
            self.governor.record(result.attempted, len(result.emitted), seconds, result.accepted)
        return result.emitted
