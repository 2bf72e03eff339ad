"""The cost governor: speculation must never make decoding slower.

It measures speculative steps against plain steps (seconds per emitted token),
parks a losing speculator - every step plain - and re-probes with backoff. The
engine owns one governor for its speculator and keeps it across requests, so a
verdict is not rediscovered on every short request. It never reads a clock: the engine times
each step and calls `record`.

Accounting rules (the TensorSharp seed's, each of which fixed a real regression):
- a step on which speculation was attempted is a speculative sample even when it
  proposed nothing (a head pass or a lookup ran; that is the cost a park avoids);
- parked steps feed the plain baseline (except the first after a switch, which
  pays the transition);
- a window's cost is its seconds over its tokens (a ratio of sums): the mean of
  each step's seconds per token would weigh a round that accepted nothing as much
  as one that emitted eight tokens, and park a drafter that wins on average;
- a probe ends early as a loss once `early_loss_steps` verifications in a row
  accepted nothing: steps whose drafts were all rejected, each a verification paid
  for one token. A step that proposed nothing (a matchless lookup, a draft head
  under its confidence gate) paid no verification: it counts in the cost windows
  but neither extends nor breaks that run, so a gate's refusals alone never park
  the speculator;
- after a loss the re-probe is short and parks back off (first_park, doubling to
  max_park); a win restores the full probe, and while a win holds the last
  `hold_window` speculative steps are compared to the baseline so a wrong win
  costs a few steps; the baseline is re-measured every `hold_steps`;
- a new request caps the remaining park at `first_park` and forgets the backoff
  (one loss is remembered, so its re-probe stays short).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Iterable


class Phase(str, enum.Enum):
    BASELINE = "baseline"  # plain steps measuring the plain cost
    PROBE = "probe"  # speculative steps measuring the speculative cost
    HOLD = "hold"  # speculation won: keep speculating, keep checking
    PARKED = "parked"  # speculation lost: plain steps until the park runs out


@dataclass(frozen=True)
class GovernorConfig:
    baseline_steps: int = 3
    probe_steps: int = 8
    short_probe_steps: int = 3
    early_loss_steps: int = 4
    first_park: int = 32
    max_park: int = 256
    hold_steps: int = 64
    hold_window: int = 8
    baseline_window: int = 32


class CostGovernor:
    def __init__(self, config: GovernorConfig | None = None) -> None:
        self.config = config or GovernorConfig()
        self.phase = Phase.BASELINE
        self.parks = 0
        self.wins = 0
        self.losses = 0
        self._plain: deque[tuple[float, int]] = deque(maxlen=self.config.baseline_window)  # (seconds, tokens) a step
        self._spec: list[tuple[float, int]] = []  # this probe's steps
        self._hold: deque[tuple[float, int]] = deque(maxlen=self.config.hold_window)
        self._phase_steps = 0
        self._skip_next_plain = False
        self._zero_accept_run = 0
        self._park_len = 0
        self._backoff = self.config.first_park  # the next park's length
        self._lost_last = False
        self._after_baseline = Phase.PROBE

    # --- what the engine asks ---------------------------------------------
    def speculate(self) -> bool:
        """Whether the next step should try speculation."""
        return self.phase in (Phase.PROBE, Phase.HOLD)

    def record(self, speculative: bool, tokens: int, seconds: float, accepted: int = 0, proposed: int = 1) -> None:
        """One decode step: whether speculation was attempted, tokens emitted, its wall time, drafts accepted, and
        drafts proposed (0: nothing was verified)."""
        step = (seconds, max(tokens, 1))
        if speculative:
            self._record_speculative(step, accepted, proposed)
        else:
            self._record_plain(step)

    def new_request(self) -> None:
        """A new request starts: cap the park at the first interval and forget the backoff."""
        self._park_len = min(self._park_len, self.config.first_park)
        self._backoff = self.config.first_park

    # --- numbers for receipts and metrics ---------------------------------
    @property
    def plain_cost(self) -> float | None:
        return _per_token(self._plain)

    def summary(self) -> dict[str, object]:
        return {
            "phase": self.phase.value,
            "parks": self.parks,
            "wins": self.wins,
            "losses": self.losses,
            "plain_s_per_token": self.plain_cost,
        }

    # --- the state machine ------------------------------------------------
    def _record_plain(self, step: tuple[float, int]) -> None:
        if self._skip_next_plain:
            self._skip_next_plain = False
        else:
            self._plain.append(step)
        self._phase_steps += 1
        if self.phase is Phase.BASELINE and self._phase_steps >= self.config.baseline_steps:
            self._enter(self._after_baseline)
        elif self.phase is Phase.PARKED and self._phase_steps >= self._park_len:
            self._enter(Phase.PROBE)

    def _record_speculative(self, step: tuple[float, int], accepted: int, proposed: int) -> None:
        self._phase_steps += 1
        if self.phase is Phase.HOLD:
            self._hold.append(step)
            if len(self._hold) == self._hold.maxlen and self._losing(_per_token(self._hold)):
                self._lose()
            elif self._phase_steps >= self.config.hold_steps:
                self._after_baseline = Phase.HOLD
                self._enter(Phase.BASELINE)
            return
        self._spec.append(step)
        if proposed:
            self._zero_accept_run = self._zero_accept_run + 1 if accepted == 0 else 0
        if self._zero_accept_run >= self.config.early_loss_steps:
            self._lose()
        elif len(self._spec) >= self._probe_len():
            if self._losing(_per_token(self._spec)):
                self._lose()
            else:
                self._win()

    def _probe_len(self) -> int:
        return self.config.short_probe_steps if self._lost_last else self.config.probe_steps

    def _losing(self, spec_cost: float | None) -> bool:
        plain = self.plain_cost
        return plain is not None and spec_cost is not None and spec_cost > plain

    def _win(self) -> None:
        self.wins += 1
        self._lost_last = False
        self._backoff = self.config.first_park
        self._enter(Phase.HOLD)

    def _lose(self) -> None:
        self.losses += 1
        self.parks += 1
        self._park_len = self._backoff
        self._backoff = min(self._backoff * 2, self.config.max_park)
        self._lost_last = True
        self._enter(Phase.PARKED)

    def _enter(self, phase: Phase) -> None:
        switching_to_plain = phase in (Phase.BASELINE, Phase.PARKED) and self.phase in (Phase.PROBE, Phase.HOLD)
        self._skip_next_plain = switching_to_plain
        self.phase = phase
        self._phase_steps = 0
        self._zero_accept_run = 0
        self._spec = []
        self._hold.clear()
        if phase is Phase.PROBE:
            self._after_baseline = Phase.PROBE


def _per_token(steps: Iterable[tuple[float, int]]) -> float | None:
    """Seconds per emitted token over the steps: their seconds over their tokens."""
    steps = list(steps)
    return sum(s for s, _ in steps) / sum(t for _, t in steps) if steps else None
