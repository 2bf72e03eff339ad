"""The cost governor: speculation must never make decoding slower.

It measures speculative steps against plain steps (seconds per emitted token),
parks a losing speculator - every step plain - and re-probes with backoff. The
engine owns one governor for its speculator and keeps it across requests, so a
verdict is not rediscovered on every short request. It never reads a clock: the engine times
each step and calls `record` (for a shared round, the request's even share of it:
docs/speculation.md). Its work on a plain step is O(members): the baseline's sums
are kept as steps come and go, and the next step's verdicts are worked out once,
however often the decoder asks (issue 41: a parked speculator costs a plain step
nothing but this bookkeeping).

Accounting rules (TensorSharp's design notes for its speculative runtime; each fixed a real regression):
- a step on which a draft head ran is a speculative sample even when it proposed
  nothing (that pass is the cost a park avoids); a lookup that found nothing and
  ran no head is a plain step (the transaction says so): its ~0.01 ms is below
  what a step's timing resolves, and costing it as speculation parked an n-gram
  lookup whose windows of misses came out 1 % over the plain cost by noise
  (docs/drafters.md);
- parked steps feed the plain baseline (except the first after a switch, which
  pays the transition); that first step's seconds beyond the plain cost are the
  speculative step's: charged to the member that ran it, in its expected loss
  and the request's excess (bench/bench_parked.py measured the plain round right
  after a lone drafter's probe 2-3 ms slower than one after a plain round,
  docs/drafters.md);
- a window's cost is its seconds over its tokens (a ratio of sums): the mean of
  each step's seconds per token would weigh a round that accepted nothing as much
  as one that emitted eight tokens, and park a drafter that wins on average;
- a probe ends early as a loss once `early_loss_steps` verifications in a row
  accepted nothing: steps whose drafts were all rejected, each a verification paid
  for one token. A step that proposed nothing (a draft head under its confidence
  gate) paid no verification: it counts in the cost windows
  but neither extends nor breaks that run, so a gate's refusals alone never park
  the speculator;
- after a loss the re-probe is short and parks back off (first_park, doubling to
  max_park); a win restores the full probe, and while a win holds the last
  `hold_window` speculative steps are compared to the baseline so a wrong win
  costs a few steps; the baseline is re-measured every `hold_steps`;
- a new request caps the remaining park at `first_park` and forgets the backoff
  (one loss is remembered, so its re-probe stays short).

The promise, kept per request on top of the verdicts (`loss_budget`): a request
decodes at no less than 0.98x of the target alone, whatever its speculators
land. The governor lets the steps it times cost a request at most 1 % of what
its tokens cost at the plain rate, half the promise: the other half is for what
no step's timing holds (a parked member's bookkeeping on every plain round,
0.06 ms of a 12.5 ms round in bench/bench_parked.py --calls; the noise of the
plain baseline it measures against; docs/drafters.md measured useless drafters
at 0.967-0.976x under a 2 % budget). The governor keeps the request's excess, each speculative
step's seconds beyond its tokens at the plain cost (negative when it won), and a
member proposes only while the excess plus the loss its next step is expected to
take stays inside the budget the request's tokens have earned. A member that wins
earns the room to keep speculating; one that never lands a draft is held to the
budget, whatever its state machine says. The first step a member ever takes in a
slot measures it (no cost is known before it runs). Two things make a member's
next step cost more than its recent steps did, and the budget counts both:

- its width: a member proposes one token a step until a draft of its lands among
  its recent steps (`width_cap`). Its first step ever, and every probe of a
  member that has landed nothing since, verifies two rows and runs one draft
  pass; a probe at full K verifies K + 1 rows, several plain steps' cost, which
  a one-token measurement never showed (bench/bench_parked.py measured such
  probes at about 3x the budget of their request);
- its catch-up: a learned drafter catches up on the rows that landed while it did
  not propose when it next proposes (`Proposal.upkeep_s`, timed by the drafter),
  so a probe after a long park pays for every row of it. The governor counts each
  member's rows not caught up (the prompt's, then every step's tokens since it
  last proposed) and expects its next step to cost its recent steps' loss without
  their catch-up plus those rows at its measured cost a row; a member holding a
  win is not held back by its catch-up (a long prompt's): its wins pay for it.

A chain of speculators (an n-gram lookup in front of a learned head) gets one
verdict per member over one plain baseline (`ChainGovernor`): a step's cost
belongs to the member that proposed, or to the last one that ran when none did,
so a head that loses is parked while the lookup in front of it keeps proposing.
Parking the whole chain for the head's losses would cost the lookup its wins
(docs/drafters.md measures both). Any member re-measuring the baseline makes
the step plain for all: the plain cost is the target's, whichever member is
parked.
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
    # The share of a request's plain-rate cost its speculative steps may lose (None: verdicts only, no budget): half
    # of the 2 % the promise allows (module docstring).
    loss_budget: float | None = 0.01


class PlainBaseline:
    """The plain cost per token: the last `baseline_window` plain steps, each but the first after a speculative step
    (that one pays the switch)."""

    def __init__(self, window: int) -> None:
        self._steps: deque[tuple[float, int]] = deque(maxlen=window)  # (seconds, tokens) a step
        self._seconds, self._tokens = 0.0, 0  # their sums, kept as steps come and go: O(1) a step
        self._after_speculative = False
        self.cost: float | None = None  # seconds per token over the window (None before the first plain step)

    def plain(self, step: tuple[float, int]) -> None:
        if not self._after_speculative:
            if len(self._steps) == self._steps.maxlen:
                self._seconds, self._tokens = self._seconds - self._steps[0][0], self._tokens - self._steps[0][1]
            self._steps.append(step)
            self._seconds, self._tokens = self._seconds + step[0], self._tokens + step[1]
            self.cost = self._seconds / self._tokens
        self._after_speculative = False

    def speculative(self) -> None:
        self._after_speculative = True

    @property
    def switching(self) -> bool:
        """Whether the next plain step is the first after a speculative one (it pays the switch back)."""
        return self._after_speculative


class CostGovernor:
    """The verdict on one speculator (one member of a chain), measured against the chain's shared baseline."""

    def __init__(self, config: GovernorConfig, baseline: PlainBaseline) -> None:
        self.config = config
        self.phase = Phase.BASELINE
        self.parks = 0
        self.wins = 0
        self.losses = 0
        self.baseline = baseline
        self._spec: list[tuple[float, int]] = []  # this probe's steps
        self._hold: deque[tuple[float, int]] = deque(maxlen=self.config.hold_window)
        # Its last steps, any phase: (seconds without their catch-up, tokens), their sums, and the drafts each landed.
        self._recent: deque[tuple[float, int]] = deque(maxlen=self.config.hold_window)
        self._recent_sums = (0.0, 0)
        self._recent_accepted: deque[int] = deque(maxlen=self.config.hold_window)
        self._catch_ups: deque[tuple[float, int]] = deque(maxlen=self.config.hold_window)  # (seconds, rows) each
        self.pending = 0  # rows that landed in the target since its last step: its next catch-up
        self._phase_steps = 0
        self._zero_accept_run = 0
        self._park_len = 0
        self._backoff = self.config.first_park  # the next park's length
        self._lost_last = False
        self._after_baseline = Phase.PROBE

    # --- what the engine asks ---------------------------------------------
    def speculate(self) -> bool:
        """Whether the next step should try speculation."""
        return self.phase in (Phase.PROBE, Phase.HOLD)

    def new_request(self, prompt_rows: int = 0) -> None:
        """A new request starts (`prompt_rows` of it to catch up on): cap the park at the first interval and forget
        the backoff."""
        self._park_len = min(self._park_len, self.config.first_park)
        self._backoff = self.config.first_park
        self.pending = prompt_rows

    @property
    def measured(self) -> bool:
        """Whether any step of this speculator has been timed (until then its cost is unknown)."""
        return bool(self._recent)

    @property
    def landing(self) -> bool:
        """Whether a draft of its landed in its recent steps (until one does, it proposes one token a step)."""
        return any(self._recent_accepted)

    @property
    def row_cost(self) -> float:
        """Its catch-up's seconds a row, over its recent catch-ups (0 before it caught up on any row)."""
        seconds, rows = sum(s for s, _ in self._catch_ups), sum(r for _, r in self._catch_ups)
        return seconds / rows if rows else 0.0

    def expected_loss(self, plain: float) -> float:
        """The seconds its next step is expected to cost beyond its tokens at `plain` seconds a token: the mean of its
        recent steps' without their catch-up, plus, unless it holds a win (whose wins pay for its catch-up, a long
        prompt's included), the catch-up on the rows it has not seen; none when that wins."""
        if not self.measured:
            return 0.0
        seconds, tokens = self._recent_sums
        catch_up = 0.0 if self.phase is Phase.HOLD else self.row_cost * self.pending
        return max(0.0, (seconds - tokens * plain) / len(self._recent) + catch_up)

    def switch_back(self, seconds: float) -> None:
        """The plain step after its last step cost `seconds` beyond the plain cost: a part of that step's cost."""
        if self._recent:
            step_seconds, tokens = self._recent[-1]
            self._recent[-1] = (step_seconds + seconds, tokens)
            self._recent_sums = (self._recent_sums[0] + seconds, self._recent_sums[1])

    # --- the state machine ------------------------------------------------
    def passing_step(self, tokens: int) -> None:
        """A step this speculator did not propose on (plain, or another chain member's) that landed `tokens` rows."""
        self.pending += tokens
        self._phase_steps += 1
        if self.phase is Phase.BASELINE and self._phase_steps >= self.config.baseline_steps:
            self._enter(self._after_baseline)
        elif self.phase is Phase.PARKED and self._phase_steps >= self._park_len:
            self._enter(Phase.PROBE)

    def speculative_step(self, step: tuple[float, int], accepted: int, proposed: int, upkeep_s: float = 0.0) -> None:
        """A step whose cost is this speculator's, `upkeep_s` of it its catch-up on the rows it had not seen."""
        if self.pending and upkeep_s:
            self._catch_ups.append((upkeep_s, self.pending))
        self.pending = step[1]  # the rows this step lands, queued for it too
        self._recent.append((step[0] - upkeep_s, step[1]))
        self._recent_sums = (sum(s for s, _ in self._recent), sum(t for _, t in self._recent))
        self._recent_accepted.append(accepted)
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
        plain = self.baseline.cost
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
        self.phase = phase
        self._phase_steps = 0
        self._zero_accept_run = 0
        self._spec = []
        self._hold.clear()
        if phase is Phase.PROBE:
            self._after_baseline = Phase.PROBE


class ChainGovernor:
    """One slot's governor: a `CostGovernor` verdict per chain member (one for a lone speculator), one baseline."""

    def __init__(self, config: GovernorConfig | None = None, members: int = 1) -> None:
        self.config = config or GovernorConfig()
        self.baseline = PlainBaseline(self.config.baseline_window)
        self.members = tuple(CostGovernor(self.config, self.baseline) for _ in range(members))
        self._request_tokens = 0  # tokens this request emitted, every step
        self._excess = 0.0  # seconds this request's speculative steps cost beyond their tokens at the plain cost
        self._last_member: int | None = None  # the member whose step was the last speculative one
        self._allowed: tuple[bool, ...] | None = None  # the next step's verdicts, worked out once a step

    def allowed(self) -> tuple[bool, ...]:
        """Which members may propose on the next step (none: a plain step)."""
        if self._allowed is None:
            self._allowed = self._verdicts()
        return self._allowed

    def _verdicts(self) -> tuple[bool, ...]:
        if any(member.phase is Phase.BASELINE for member in self.members):
            return (False,) * len(self.members)
        return tuple(member.speculate() and self._affordable(member) for member in self.members)

    def speculate(self) -> bool:
        return any(self.allowed())

    def width_cap(self) -> int | None:
        """The most proposals the next step may make: one while a member that may propose has landed no draft in its
        recent steps (its first step ever among them)."""
        allowed = self.allowed()
        return 1 if any(ok and not member.landing for ok, member in zip(allowed, self.members, strict=True)) else None

    def _affordable(self, member: CostGovernor) -> bool:
        """Whether the request's loss budget covers the member's next step (module docstring: the promise)."""
        plain = self.baseline.cost
        if self.config.loss_budget is None or plain is None:
            return True
        budget = self.config.loss_budget * plain * self._request_tokens
        return self._excess + member.expected_loss(plain) <= budget

    def record(self, member: int | None, tokens: int, seconds: float, accepted: int = 0, proposed: int = 1,
               upkeep_s: float = 0.0) -> None:
        """One decode step: the member whose cost it was (None: a plain step), tokens emitted, its wall time, drafts
        accepted, drafts proposed (0: nothing was verified) and the seconds of it the member spent catching up."""
        step = (seconds, max(tokens, 1))
        plain = self.baseline.cost
        self._allowed = None
        self._request_tokens += step[1]
        if member is None:
            if self.baseline.switching and plain is not None and self._last_member is not None:
                switch = seconds - step[1] * plain
                self._excess += switch
                self.members[self._last_member].switch_back(switch)
            self.baseline.plain(step)
        else:
            self._last_member = member
            self.baseline.speculative()
            if plain is not None:
                self._excess += seconds - step[1] * plain
        for index, governor in enumerate(self.members):
            if index == member:
                governor.speculative_step(step, accepted, proposed, upkeep_s)
            elif member is None or governor.phase is Phase.PARKED:
                governor.passing_step(step[1])
            else:
                governor.pending += step[1]

    def new_request(self, prompt_rows: int = 0) -> None:
        """A new request starts, with `prompt_rows` rows each member is told when it first proposes."""
        for member in self.members:
            member.new_request(prompt_rows)
        self._request_tokens, self._excess, self._allowed = 0, 0.0, None

    @property
    def parks(self) -> int:
        return sum(member.parks for member in self.members)

    @property
    def plain_cost(self) -> float | None:
        return self.baseline.cost


def _per_token(steps: Iterable[tuple[float, int]]) -> float | None:
    """Seconds per emitted token over the steps: their seconds over their tokens."""
    steps = list(steps)
    return sum(s for s, _ in steps) / sum(t for _, t in steps) if steps else None
