"""The exactness transaction: one speculative round, all or nothing.

A request's committed state is its token list (prompt + emitted) and a target
holding every one of those tokens except the last - the anchor, whose row the
next round computes. Each round runs seven steps (docs/reference.md):

1. CHECKPOINT  target, drafter and decoder state (the sampler is counter-based:
               its state is the emitted position, so it needs no copy);
2. PROPOSE     ask the speculator for at most the scheduled number of tokens;
3. VERIFY      forward anchor + proposals in ONE target pass;
4. SAMPLE      draw target rows only through the first mismatch;
5. COMMIT      keep the accepted prefix and discard every rejected state row:
               rewind the KV, restore recurrent state from the per-row snapshot,
               or - when the rejected suffix is outside the resident window -
               restore the checkpoint and replay the kept rows exactly once;
               keep what landed for the speculator;
6. EMIT        append the accepted drafts and exactly one correction or bonus token;
7. RESTORE     on cancellation or any failure, return to the checkpoint: the
               state equals a run that never attempted the round.

The autoregressive path is the same round with zero proposals, and a round in
which no speculator proposes (the cost governor parked it, or gated it off for
the step) is exactly that round: it never calls the speculator - no checkpoint,
no proposal, no commit - and keeps only references to the rows that landed and
their tapped hidden rows (residuals the forward computed anyway). The speculator
is told them all, one call per run of consecutive positions, on the next round
it proposes in, before it proposes: its catch-up is batched over the rounds it
missed and timed in that round, the round the cost governor charges to it
(issue 41). Rows a speculator's window would have evicted by then
(`Speculator.window_rows`) are dropped unseen.

Steps 1-2 (`open_round`) and 4-7 (`close_round`) are the sequence's own; step 3's
forward may be shared: the decoder verifies the open rounds of several
sequences in one forward (`power.runtime.trunks.batch`), in which
each sequence's rows are computed exactly as in a forward of their own. A
failure inside one sequence's steps restores that sequence alone; a failed
shared forward restores every sequence that was in it (`abort_round`).
`round` is the whole transaction for one sequence on its own.

The prompt goes in the same way, piece by piece (`begin`, `next_piece`,
`take_piece`): each piece lies inside one prefill chunk of the sequence's
positions, so a prompt's rows are the same bits however its pieces are
grouped with other sequences' pieces.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import torch

from power.kernels import dispatch
from power.runtime.trunks.protocol import ForwardOut, OutsideResidentWindow, Trunk

from .sampling import Lane, Sampler, uniform
from .speculators.base import DraftContext, Proposal, Speculator, runs, within_window


class Step(enum.IntEnum):
    CHECKPOINT = 1
    PROPOSE = 2
    VERIFY = 3
    SAMPLE = 4
    COMMIT = 5
    EMIT = 6
    RESTORE = 7


class Cancelled(Exception):
    """The request was cancelled mid-round; the round was rolled back."""

    def __init__(self, step: Step) -> None:
        super().__init__(f"cancelled at step {step.value} ({step.name.lower()}); the round was rolled back")
        self.step = step


@dataclass(frozen=True)
class RoundResult:
    emitted: list[int]  # accepted proposals, then the one correction or bonus token
    proposed: int
    accepted: int
    replayed: bool  # the rejected suffix was outside the resident window: restored and replayed
    # The chain member whose pass the round paid for (Proposal.member); None: a plain round, for the cost governor
    member: int | None
    upkeep_s: float = 0.0  # of the round's time, its speculator's catch-up (Proposal.upkeep_s)


@dataclass(frozen=True)
class Landed:
    """Rows that landed in the target at [start, start + len(tokens)) with their tapped hidden rows, kept until the
    speculator is told."""

    tokens: tuple[int, ...]
    hidden: dict[int, torch.Tensor]
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class _Checkpoint:
    trunk: Any
    speculator: Any
    told: bool  # whether the round calls the speculator (else `speculator` is not its state and nothing changes it)
    untold: tuple[Landed, ...]
    length: int


@dataclass(frozen=True)
class OpenRound:
    """A round between its proposal and its verification: the rows to verify and the state to return to."""

    checkpoint: _Checkpoint
    start: int  # the anchor's position
    rows: list[int]  # the anchor, then the proposals
    probs: torch.Tensor | None  # the proposals' draft distributions (None: certain guesses)
    member: int | None  # RoundResult.member
    upkeep_s: float = 0.0  # RoundResult.upkeep_s

    @property
    def drafts(self) -> list[int]:
        return self.rows[1:]


# Called after each step completes; raising from it aborts the round (fault injection, instrumentation).
StepObserver = Callable[[Step], None]


class SpeculativeSequence:
    """One request's committed state and the transaction that advances it."""

    def __init__(
        self,
        trunk: Trunk,
        sampler: Sampler,
        speculator: Speculator | None = None,
        stop_ids: Collection[int] = (),
        cancel: threading.Event | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.trunk = trunk
        self.sampler = sampler
        self.speculator = speculator
        self.stop_ids = frozenset(stop_ids)
        self.cancel = cancel or threading.Event()
        self.observer = observer
        self.tokens: list[int] = []
        self.prompt_length = 0
        self.prefilled = 0  # prompt positions in the target
        self.untold: tuple[Landed, ...] = ()  # rows that landed since the speculator last proposed, in position order

    @property
    def taps(self) -> tuple[int, ...]:
        return self.speculator.taps if self.speculator else ()

    @property
    def emitted(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    # --- the prompt -----------------------------------------------------------
    def start(self, prompt: Sequence[int]) -> int:
        """Prefill the whole prompt in one go and emit the first token (drawn from the prompt's last row)."""
        self.begin(prompt)
        rest = self.tokens[self.prefilled :]
        first = self.take_piece(rest, self.trunk.prefill(rest, taps=self.taps))
        assert first is not None, "the whole prompt was one piece, so its last row emits"
        return first

    def begin(self, prompt: Sequence[int], reuse: int = 0) -> None:
        """Arm for `prompt`, keeping the target's first `reuse` positions (a prefix it already holds exactly,
        `Trunk.reusable_prefix`) and emptying the rest."""
        if not prompt:
            raise ValueError("the prompt is empty: at least one token is needed to condition on")
        if not 0 <= reuse < len(prompt):
            raise ValueError(f"a reused prefix of {reuse} positions must leave a prompt row to compute "
                             f"(the prompt is {len(prompt)} tokens)")
        if reuse:
            self.trunk.resume(reuse)
        else:
            self.trunk.reset()
        self.tokens, self.prompt_length, self.prefilled = list(prompt), len(prompt), reuse
        self.untold = ()
        if self.speculator:
            self.speculator.begin(prompt)

    def next_piece(self) -> list[int]:
        """The prompt rows still to prefill, up to the end of the target's current prefill chunk."""
        end = min(self.prompt_length, self.prefilled + self.trunk.chunk_room())
        return self.tokens[self.prefilled : end]

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prompt_length

    def take_piece(self, piece: Sequence[int], out: ForwardOut) -> int | None:
        """The piece's rows are in the target: keep them for the speculator; after the last one, emit the first
        token."""
        self._keep(piece, out, self.prefilled)
        self.prefilled += len(piece)
        if self.prefilling:
            return None
        first = int(out.argmax[-1]) if out.argmax is not None else self.sampler.sample(out.logits[-1],
                                                                                        self.prompt_length)
        self.tokens.append(first)
        return first

    def takes_argmax(self, drafts: int) -> bool:
        """Whether a round verifying `drafts` proposals (0: the prompt's last row) needs only each row's argmax, which
        the trunk may then choose by the exact greedy head (`Part.argmax_only`): greedy sampling, verified by the
        `match` rule or with nothing to verify (greedy `rejection` reads the one-hot target distribution)."""
        params = self.sampler.params
        return params.greedy and (params.verify == "match" or drafts == 0)

    # --- a round ----------------------------------------------------------------
    def round(self, width: int) -> RoundResult:
        """Advance by one transaction asking for at most `width` proposals; emits 1..width+1 tokens."""
        opened = self.open_round(width)
        try:
            out = self.trunk.forward(opened.rows, taps=self.taps)
        except BaseException:
            self.abort_round(opened)
            raise
        return self.close_round(opened, out)

    def open_round(self, width: int, members: Sequence[bool] | None = None) -> OpenRound:
        """Steps 1-2: checkpoint and propose (`members`: which chain members may); the rows go
        to the target (step 3)."""
        checkpoint = self._checkpoint(speculating=width > 0)
        try:
            return self._open(width, members, checkpoint)
        except BaseException:
            self._restore(checkpoint)
            raise

    def close_round(self, opened: OpenRound, out: ForwardOut) -> RoundResult:
        """Steps 4-6 on the target's rows for `opened` (step 7 on any failure)."""
        try:
            return self._close(opened, out)
        except BaseException:
            self._restore(opened.checkpoint)
            raise

    def abort_round(self, opened: OpenRound) -> None:
        """The forward that was to verify `opened` failed: step 7."""
        self._restore(opened.checkpoint)

    # --- the seven steps ----------------------------------------------------
    def _open(self, width: int, members: Sequence[bool] | None, checkpoint: _Checkpoint) -> OpenRound:
        self._after(Step.CHECKPOINT)
        anchor, start = self.tokens[-1], self.trunk.position
        if not 0 <= width < self.trunk.config.verify_capacity:
            raise ValueError(f"a round of {width} proposals needs {width + 1} rows; the verification capacity is "
                             f"{self.trunk.config.verify_capacity} (the engine cuts K once: ProposalWidth)")
        speculator = self.speculator if width > 0 else None
        if speculator is not None:
            self._tell(speculator)
        proposal = speculator.propose(DraftContext(self.tokens, width,
                                                   members)) if speculator is not None else Proposal()
        drafts = proposal.tokens[:width]
        self._after(Step.PROPOSE)
        # A lookup that found nothing and ran no head cost ~0.01 ms of a ~14 ms step: a plain round to the governor.
        member = proposal.member if speculator is not None and (drafts or proposal.head_ran) else None
        return OpenRound(checkpoint, start, [anchor, *drafts], proposal.probs, member, proposal.upkeep_s)

    def _close(self, opened: OpenRound, out: ForwardOut) -> RoundResult:
        self._after(Step.VERIFY)
        drafts = opened.drafts
        accepted, last = self._sample(out, drafts, opened.probs)
        self._after(Step.SAMPLE)

        kept = [opened.rows[0], *drafts[:accepted]]
        replayed = self._discard_rejected(opened.start, kept, opened.checkpoint)
        self._keep(kept, out, opened.start)
        self._after(Step.COMMIT)

        emitted = [*drafts[:accepted], last]
        self.tokens.extend(emitted)
        self._after(Step.EMIT)
        return RoundResult(emitted, len(drafts), accepted, replayed, opened.member, opened.upkeep_s)

    def _sample(self, out: ForwardOut, drafts: list[int], probs: torch.Tensor | None) -> tuple[int, int]:
        """Rows through the first mismatch: (accepted proposals, the correction or bonus token)."""
        first_position, logits = len(self.tokens), out.logits
        params = self.sampler.params
        if out.argmax is not None:  # the greedy head chose each row's token
            accepted, last = _first_mismatch(out.argmax.tolist(), drafts)
        elif params.greedy and params.verify == "match":
            accepted, last = map(int, dispatch.greedy_verify(logits.contiguous(), _ids(drafts, logits.device)))
        elif params.verify == "rejection" and drafts:
            accepted, last = self._verify_rejection(logits, drafts, probs, first_position)
        else:
            accepted, last = self._verify_match(logits, drafts, first_position)
        return self._stop_at_first_stop(drafts, accepted, last)

    def _verify_match(self, logits: torch.Tensor, drafts: list[int], first_position: int) -> tuple[int, int]:
        for row, draft in enumerate(drafts):
            token = self.sampler.sample(logits[row], first_position + row)
            if token != draft:
                return row, token
        return len(drafts), self.sampler.sample(logits[len(drafts)], first_position + len(drafts))

    def _verify_rejection(
        self, logits: torch.Tensor, drafts: list[int], probs: torch.Tensor | None, first_position: int
    ) -> tuple[int, int]:
        target = torch.stack([self.sampler.probs(row) for row in logits])
        draft = (probs if probs is not None else _one_hot(drafts, target.shape[-1])).to(target)
        seed = self.sampler.params.seed
        uniforms = torch.tensor(
            [[uniform(seed, first_position + row, lane) for lane in Lane] for row in range(len(drafts) + 1)],
            dtype=torch.float64, device=target.device,
        )
        accepted, last = dispatch.rejection_step(target, draft.contiguous(), _ids(drafts, target.device), uniforms)
        return int(accepted), int(last)

    def _stop_at_first_stop(self, drafts: list[int], accepted: int, last: int) -> tuple[int, int]:
        """An accepted stop token ends the round: it becomes the emitted last token and nothing after it is kept."""
        for row in range(accepted):
            if drafts[row] in self.stop_ids:
                return row, drafts[row]
        return accepted, last

    def _discard_rejected(self, start: int, kept: list[int], checkpoint: _Checkpoint) -> bool:
        """Rewind the target to `start + len(kept)`; replay from the checkpoint if that is outside the window."""
        try:
            self.trunk.rewind(start + len(kept))
            return False
        except OutsideResidentWindow:
            self.trunk.restore(checkpoint.trunk)
            self.trunk.forward(kept)
            return True

    def _keep(self, tokens: Sequence[int], out: ForwardOut, start: int) -> None:
        """Rows that landed, kept for the speculator until it next proposes (the rows its window still shows then)."""
        if self.speculator is None:
            return
        hidden = {layer: _alone(tapped[: len(tokens)]) for layer, tapped in out.hidden.items()}
        self.untold = within_window((*self.untold, Landed(tuple(tokens), hidden, start)), self.speculator.window_rows)

    def _tell(self, speculator: Speculator) -> None:
        """Everything that landed since the speculator last proposed: one commit per run of consecutive positions."""
        for run in runs(self.untold):
            tokens = [token for landed in run for token in landed.tokens]
            hidden = {layer: torch.cat([landed.hidden[layer] for landed in run]).cpu() for layer in run[0].hidden}
            speculator.commit(tokens, hidden, run[0].start)
        self.untold = ()

    def _checkpoint(self, speculating: bool) -> _Checkpoint:
        told = self.speculator is not None and speculating
        speculator = self.speculator.checkpoint() if self.speculator and told else None
        return _Checkpoint(self.trunk.checkpoint(), speculator, told, self.untold, len(self.tokens))

    def _restore(self, checkpoint: _Checkpoint) -> None:
        self.trunk.restore(checkpoint.trunk)
        if self.speculator and checkpoint.told:
            self.speculator.restore(checkpoint.speculator)
        self.untold = checkpoint.untold
        del self.tokens[checkpoint.length :]
        if self.observer:
            self.observer(Step.RESTORE)

    def _after(self, step: Step) -> None:
        if self.cancel.is_set():
            raise Cancelled(step)
        if self.observer:
            self.observer(step)


def _alone(rows: torch.Tensor) -> torch.Tensor:
    """`rows`, holding no memory but their own: a plain round's one tapped row is its forward's whole output and is
    kept as it is; rows cut from a larger output (a batch's, a padded shape's, rejected rows) are copied out of it."""
    return rows if rows.untyped_storage().nbytes() == rows.numel() * rows.element_size() else rows.clone()


def _first_mismatch(chosen: list[int], drafts: list[int]) -> tuple[int, int]:
    """Each row's greedy token against the proposals: (accepted proposals, the correction or bonus token)."""
    for row, draft in enumerate(drafts):
        if chosen[row] != draft:
            return row, chosen[row]
    return len(drafts), chosen[len(drafts)]


def _ids(tokens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64, device=device)


def _one_hot(tokens: list[int], vocab: int) -> torch.Tensor:
    """A deterministic proposal is a draw from the one-hot distribution on that token."""
    q = torch.zeros(len(tokens), vocab, dtype=torch.float64)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.int64)] = 1.0
    return q
