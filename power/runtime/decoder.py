"""The decode loop: up to `slots` requests at once, rounds of the exactness transaction sharing one forward.

Plain (autoregressive) decoding is this loop with no speculator: every round is
a zero-proposal round through the same transaction, the same target forward
(whose rows are the same bits at any row count, docs/runtime.md) and the same
sampler. That is what makes a greedy speculative stream bit-identical to the
plain one.

The trunk holds `slots` sequences, each with its own cache region and recurrent
state (`power.runtime.trunks.batch`). A request takes a free slot and gets its
own transaction, speculator (the slot's: weights shared, state its own),
scheduler, sampler and counters; each slot keeps its own cost governor across
its requests. One `step` of the loop runs:

1. admission: waiting requests take free slots, each the slot whose cache holds
   the longest prefix of its prompt that can be reused exactly (whole prefill
   chunks, `Trunk.reusable_prefix`): those positions are not computed again;
2. the next piece of every prompt being prefilled (a piece never crosses a
   chunk boundary of its own sequence), packed into as few forwards of
   `prefill_chunk` rows as hold them;
3. one decode round: every decoding request's open round - its anchor row and
   its proposals - verified in one forward of at most `verify_capacity` rows, then each
   request samples, commits and emits on its own rows.

How a round's rows are shared: every decoding request gets its anchor row, in
a order that rotates by one each round; the rows left go to proposals in that
order. A request whose tokens do not depend on its proposals (greedy, or the
`match` rule) proposes fewer when its scheduled width does not fit; one whose
tokens do (the `rejection` rule at a temperature) waits for a round where its
whole width fits, and gets it when it heads the order. When more requests
decode than the shape has rows, the ones at the end of the order wait a round.
Cancellation, stop strings and faults act on one request at a round boundary;
the others go on. A request's tokens are the same bits alone or beside others.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable, Collection, Sequence

from power.documents.receipt import SpeculationRates, count_positions
from power.runtime.trunks.base import FixedShapeTrunk, Part, TrunkSequence

from .governor import ChainGovernor, GovernorConfig
from .sampling import Sampler
from .scheduler import Scheduler, SchedulerConfig
from .speculators.base import Speculator
from .speculators.ngram import common_prefix_length
from .transaction import Cancelled, OpenRound, RoundResult, SpeculativeSequence, StepObserver


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
    # The target's own decode rate inside this engine: the cost governor's plain baseline when the request ended
    # (None without a governor, or before it measured one)
    plain_tok_s: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    position_reached: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)

    def add_round(self, result: RoundResult) -> None:
        self.rounds += 1
        self.speculative_rounds += result.proposed > 0
        self.proposed += result.proposed
        self.accepted += result.accepted
        self.replays += result.replayed
        count_positions(self.position_reached, self.position_accepted, result.proposed, result.accepted)

    def to_json(self) -> dict[str, object]:
        return asdict(self) | {"acceptance": self.acceptance, "mean_accepted_length": self.mean_accepted_length,
                               "acceptance_by_position": self.acceptance_by_position}


@dataclass
class Generation:
    tokens: list[int]  # emitted token IDs (prompt excluded)
    stats: SpeculationStats
    stopped: bool = False  # ended on a stop token (the engine also sets it for a stop string)
    cancelled: bool = False  # cancelled mid-round (that round rolled back)
    sequence: SpeculativeSequence | None = field(default=None, repr=False)
    reused: int = 0  # prompt positions taken from the slot's cache instead of prefilled


@dataclass
class DecodeRequest:
    """One request for the decoder.

    Setting `cancel` (from any thread) ends the request at the next step boundary with the open round rolled
    back. Setting `finish` ends it after the round in hand commits, as a normal end: the caller's own stop
    condition (a stop string), with nothing rolled back. `on_tokens` receives each committed round's emitted
    tokens (the prefill's first token included) as they land; `on_done` the request once it has ended.
    """

    prompt: Sequence[int]
    max_new_tokens: int
    sampler: Sampler
    stop_ids: Collection[int] = ()
    cancel: threading.Event | None = None
    observer: StepObserver | None = None
    finish: threading.Event | None = None
    on_tokens: Callable[[list[int]], None] | None = None
    on_done: Callable[[Decoding], None] | None = None


@dataclass(eq=False)
class Slot:
    """One of the trunk's sequences, with what outlives a request there."""

    index: int
    trunk: TrunkSequence
    speculator: Speculator | None
    governor: ChainGovernor | None
    cached: list[int] = field(default_factory=list)  # prompt tokens whose rows the slot's cache holds, as prefilled
    holder: Decoding | None = None


@dataclass(frozen=True)
class SlotAssignment:
    """Where a request decodes once it has a slot: the slot, its transaction and its K/S scheduler."""

    slot: Slot
    seq: SpeculativeSequence
    scheduler: Scheduler


@dataclass(eq=False)
class Decoding:
    """A request inside the decoder: waiting, prefilling, decoding, then done with a generation or an error."""

    request: DecodeRequest
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    placement: SlotAssignment | None = None  # set when it takes a slot
    generation: Generation | None = None  # set when it ends normally or cancelled
    error: Exception | None = None  # set when it failed
    reused: int = 0
    _started: float = 0.0
    _parks_before: int = 0

    @property
    def placed(self) -> SlotAssignment:
        if self.placement is None:
            raise RuntimeError("the request has not taken a slot yet")
        return self.placement

    @property
    def slot(self) -> Slot:
        return self.placed.slot

    @property
    def seq(self) -> SpeculativeSequence:
        return self.placed.seq

    @property
    def scheduler(self) -> Scheduler:
        return self.placed.scheduler

    @property
    def done(self) -> bool:
        return self.generation is not None or self.error is not None

    def result(self) -> Generation:
        """The generation of a request that has ended; its error raised if it failed."""
        if self.error is not None:
            raise self.error
        if self.generation is None:
            raise RuntimeError("the request has not ended yet")
        return self.generation

    @property
    def decoding(self) -> bool:
        return not self.done and self.placement is not None and not self.seq.prefilling

    @property
    def draws_depend_on_proposals(self) -> bool:
        return self.request.sampler.params.draws_depend_on_proposals


class Decoder:
    """Decodes requests on one trunk, `trunk.config.slots` at a time, with an optional speculator (None: plain
    decoding; other slots get `speculator.spawn()`). `governor`: each slot's cost governor settings (None: off)."""

    def __init__(
        self,
        trunk: FixedShapeTrunk,
        sampler: Sampler,
        speculator: Speculator | None = None,
        schedule: SchedulerConfig | None = None,
        governor: GovernorConfig | None = None,
    ) -> None:
        self.trunk = trunk
        self.sampler = sampler  # what `generate` samples with
        self.speculator = speculator
        self.schedule = schedule or SchedulerConfig(k=0, s=max(1, trunk.config.snapshot_rows))
        self.governor = governor
        self.slots = [Slot(i, trunk.sequence(i), None, None) for i in range(trunk.config.slots)]
        self.waiting: deque[Decoding] = deque()
        self._turn = 0

    # --- the interface --------------------------------------------------------
    def submit(self, request: DecodeRequest) -> Decoding:
        """Queue a request; `step` admits it when a slot is free."""
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if not request.prompt:
            raise ValueError("the prompt is empty: at least one token is needed to condition on")
        decoding = Decoding(request)
        self.waiting.append(decoding)
        return decoding

    def step(self) -> None:
        """Admit what fits, prefill a piece of every prompt being read and run one decode round (each only when it
        has rows)."""
        self._admit()
        self._prefill()
        self._decode()

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(slot.holder for slot in self.slots)

    @property
    def free_slots(self) -> int:
        return sum(slot.holder is None for slot in self.slots) - len(self.waiting)

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
        """Decode one request to its end with `self.sampler` (stepping any others in flight too)."""
        decoding = self.submit(DecodeRequest(prompt, max_new_tokens, self.sampler, stop_ids, cancel, observer,
                                             finish, on_tokens))
        while not decoding.done:
            self.step()
        return decoding.result()

    # --- 1. admission -----------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and (free := [slot for slot in self.slots if slot.holder is None]):
            decoding = self.waiting.popleft()
            cancel = decoding.request.cancel
            if cancel is not None and cancel.is_set():  # its client left while it waited
                self._end(decoding, cancelled=True)
                continue
            reuse, slot = max(((self._reusable(s, decoding.request), s) for s in free),
                              key=lambda offer: (offer[0], -offer[1].index))
            self._place(decoding, slot, reuse)

    def _reusable(self, slot: Slot, request: DecodeRequest) -> int:
        """Prompt positions `slot` can hand to `request` exactly (none when a drafter's state would shape its draws)."""
        if request.sampler.params.draws_depend_on_proposals and self.speculator is not None:
            return 0
        shared = common_prefix_length(slot.cached, request.prompt)
        return slot.trunk.reusable_prefix(min(shared, len(request.prompt) - 1))

    def _place(self, decoding: Decoding, slot: Slot, reuse: int) -> None:
        request = decoding.request
        if self.speculator is not None and slot.speculator is None:
            slot.speculator = self.speculator if slot.index == 0 else self.speculator.spawn()
            slot.governor = ChainGovernor(self.governor, self.speculator.member_count) if self.governor else None
        slot.holder = decoding
        decoding._started = time.perf_counter()
        seq = SpeculativeSequence(slot.trunk, request.sampler, slot.speculator, request.stop_ids, request.cancel,
                                  request.observer)
        decoding.placement = SlotAssignment(slot, seq, Scheduler(self.schedule))
        decoding.reused = reuse
        try:
            seq.begin(request.prompt, decoding.reused)
        except Exception as err:  # noqa: BLE001 - one request's failure, reported on it
            self._end(decoding, error=err)
            return
        slot.cached = list(request.prompt[: decoding.reused])
        if slot.governor:
            decoding._parks_before = slot.governor.parks
            slot.governor.new_request(len(request.prompt) - decoding.reused)

    # --- 2. prefill ---------------------------------------------------------------
    def _prefill(self) -> None:
        """The next piece of every prompt being prefilled, in as few chunk forwards as hold them."""
        for forward in self._prefill_forwards(self._next_pieces()):
            self._prefill_forward(forward)

    def _next_pieces(self) -> list[tuple[Decoding, list[int]]]:
        pieces = []
        for slot in self.slots:
            decoding = slot.holder
            if decoding is None or not decoding.seq.prefilling:  # a slot's holder is placed and not yet done
                continue
            if decoding.seq.cancel.is_set():
                self._end(decoding, cancelled=True)
                continue
            pieces.append((decoding, decoding.seq.next_piece()))
        return pieces

    def _prefill_forwards(self, pieces: list[tuple[Decoding, list[int]]]) -> list[list[tuple[Decoding, list[int]]]]:
        """Pieces packed in slot order into forwards of at most `prefill_chunk` rows, each into the first that has
        room for it."""
        chunk = self.trunk.options.prefill_chunk
        forwards: list[list[tuple[Decoding, list[int]]]] = []
        for decoding, piece in pieces:
            room = next((f for f in forwards if sum(len(p) for _, p in f) + len(piece) <= chunk), None)
            if room is None:
                forwards.append(room := [])
            room.append((decoding, piece))
        return forwards

    def _prefill_forward(self, pieces: list[tuple[Decoding, list[int]]]) -> None:
        parts = [Part(d.slot.index, piece, int(d.seq.prefilled + len(piece) == d.seq.prompt_length),
                      d.seq.takes_argmax(0)) for d, piece in pieces]
        try:
            outs = self.trunk.prefill_parts(parts, self._taps)
        except Exception as err:  # noqa: BLE001 - the forward failed: every request in it fails, the loop goes on
            for decoding, _ in pieces:
                self._end(decoding, error=err)
            return
        for (decoding, piece), out in zip(pieces, outs, strict=True):
            seq = decoding.seq
            try:
                first = seq.take_piece(piece, out)
                decoding.slot.cached = seq.tokens[: seq.prefilled]
                if first is not None:
                    decoding.stats.prefill_s = time.perf_counter() - decoding._started
                    self._landed(decoding, [first])
            except Exception as err:  # noqa: BLE001
                self._end(decoding, error=err)

    # --- 3. a decode round --------------------------------------------------------
    def _decode(self) -> None:
        ready = [slot.holder for slot in self.slots if slot.holder is not None and slot.holder.decoding]
        if not ready:
            return
        turn = self._turn % len(ready)
        self._turn += 1
        started = time.perf_counter()
        opened: list[tuple[Decoding, OpenRound]] = []
        for decoding, width in self._grants(ready[turn:] + ready[:turn]):
            try:
                governor = decoding.slot.governor
                opened.append((decoding, decoding.seq.open_round(width, governor.allowed() if governor else None)))
            except Exception as err:  # noqa: BLE001 - restored by the transaction; this request ends
                self._failed(decoding, err)
        if not opened:
            return
        try:
            outs = self.trunk.forward_parts([Part(d.slot.index, r.rows, argmax_only=d.seq.takes_argmax(len(r.drafts)))
                                             for d, r in opened], self._taps)
        except Exception as err:  # noqa: BLE001 - every request in the failed forward is restored and ends
            for decoding, round_ in opened:
                decoding.seq.abort_round(round_)
                self._failed(decoding, err)
            return
        closed: list[tuple[Decoding, RoundResult]] = []
        for (decoding, round_), out in zip(opened, outs, strict=True):
            try:
                closed.append((decoding, decoding.seq.close_round(round_, out)))
            except Exception as err:  # noqa: BLE001
                self._failed(decoding, err)
        share = (time.perf_counter() - started) / len(opened)
        for decoding, result in closed:
            self._account(decoding, result, share)

    def _grants(self, order: list[Decoding]) -> list[tuple[Decoding, int]]:
        """Each request's proposal width this round (module docstring: how a round's rows are shared)."""
        left = self.trunk.config.verify_capacity
        widths: dict[Decoding, int] = {}
        head = order[0]
        if head.draws_depend_on_proposals:  # its whole width before anyone's anchor
            widths[head] = self._wanted(head)
            left -= 1 + widths[head]
        for decoding in order:
            if decoding not in widths and left:
                widths[decoding] = 0
                left -= 1
        for decoding in list(widths):
            if decoding is head and head.draws_depend_on_proposals:
                continue
            wanted = self._wanted(decoding)
            if wanted <= left:
                widths[decoding] = wanted
                left -= wanted
            elif not decoding.draws_depend_on_proposals:
                widths[decoding], left = left, 0
            else:  # it waits for a round where its whole width fits
                del widths[decoding]
                left += 1
        return [(decoding, widths[decoding]) for decoding in order if decoding in widths]

    def _wanted(self, decoding: Decoding) -> int:
        slot, remaining = decoding.slot, decoding.request.max_new_tokens - len(decoding.seq.emitted)
        governor = slot.governor
        if slot.speculator is None or (governor is not None and not governor.speculate()):
            return 0
        cap = governor.width_cap() if governor is not None else None
        return min(decoding.scheduler.width(), remaining - 1, cap or remaining)

    def _account(self, decoding: Decoding, result: RoundResult, seconds: float) -> None:
        """`seconds`: the request's even share of the round's forward. Within one company of requests a speculative
        round weighs against a plain one as the whole forward would; when the company changes (a request that read
        its plain cost alone, then decodes beside seven others' drafts) the share moves far less than the whole
        forward does, which would make the same drafts a loss beside the others and a win alone."""
        decoding.stats.add_round(result)
        decoding.scheduler.record(result.proposed, result.accepted, result.replayed)
        if decoding.slot.governor:
            decoding.slot.governor.record(result.member, len(result.emitted), seconds, result.accepted,
                                          result.proposed, result.upkeep_s)
        try:
            self._landed(decoding, result.emitted)
        except Exception as err:  # noqa: BLE001 - the caller's callback failed: this request ends
            self._end(decoding, error=err)

    def _landed(self, decoding: Decoding, tokens: list[int]) -> None:
        """Committed tokens: hand them on, then end the request if they finished it."""
        request, seq = decoding.request, decoding.seq
        if request.on_tokens:
            request.on_tokens(tokens)
        stopped = seq.tokens[-1] in seq.stop_ids
        finished = request.finish is not None and request.finish.is_set()
        if stopped or finished or len(seq.emitted) >= request.max_new_tokens:
            self._end(decoding, stopped=stopped)

    # --- the end of a request -------------------------------------------------------
    def _failed(self, decoding: Decoding, err: Exception) -> None:
        if isinstance(err, Cancelled):
            self._end(decoding, cancelled=True)
        else:
            self._end(decoding, error=err)

    def _end(self, decoding: Decoding, stopped: bool = False, cancelled: bool = False,
             error: Exception | None = None) -> None:
        if decoding.done:
            return
        stats, placement = decoding.stats, decoding.placement
        if decoding._started:
            stats.decode_s = time.perf_counter() - decoding._started - stats.prefill_s
        if placement is not None:
            stats.clamps, stats.fallbacks = placement.scheduler.clamps, placement.scheduler.fallbacks
            governor = placement.slot.governor
            if governor:
                stats.governor_parks = governor.parks - decoding._parks_before
                stats.plain_tok_s = 1.0 / governor.plain_cost if governor.plain_cost else None
            placement.slot.holder = None
        seq = placement.seq if placement else None
        if error is not None:
            decoding.error = error
        else:
            decoding.generation = Generation(seq.emitted if seq else [], stats, stopped, cancelled, seq,
                                             decoding.reused)
        if decoding.request.on_done:
            decoding.request.on_done(decoding)

    @property
    def _taps(self) -> tuple[int, ...]:
        return self.speculator.taps if self.speculator else ()
