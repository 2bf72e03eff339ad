"""The speculator interface: propose, commit, reset - and nothing about verification.

A speculator is free to be wrong; the transaction only ever emits tokens drawn
from target rows. What it must get right is its own bookkeeping: `commit` tells
it exactly which tokens landed in the target (with their tapped hidden rows), so
a learned drafter's cache and a lookup drafter's index both track reality.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

import torch

from power.documents.kv_types import F32

from ..errors import RuntimeInputError
from ..gguf_weights import GGUFFile
from ..trunks.protocol import Trunk


@dataclass(frozen=True)
class NGramWindow:
    """The plan's n-gram settings: the tokens the lookup matches, the shortest draft kept, the longest drafted."""

    match: int
    draft_min: int
    draft_max: int

    def __post_init__(self) -> None:
        if self.match < 1 or not 1 <= self.draft_min <= self.draft_max:
            raise ValueError(f"an n-gram window needs match >= 1 and 1 <= draft_min <= draft_max, got "
                             f"match {self.match}, drafts {self.draft_min}..{self.draft_max}")


@dataclass(frozen=True)
class SpeculatorRequest:
    """What a speculator's `build` gets: the target it serves and the plan's settings for it."""

    trunk: Trunk
    target: GGUFFile | None = None  # the verified target GGUF (native heads such as mtp live in it)
    drafter: GGUFFile | None = None  # a verified external drafter (dflash, dflash2, dspark, an MTP-only sidecar)
    fr_vocab_size: int | None = None  # FR: the draft head's token-ID prefix
    ngram: NGramWindow | None = None  # the n-gram lookup's window
    p_min: float | None = None  # the confidence a drafted position needs (DSpark's gate); None: the header's
    kv_type: str = F32  # the element type a drafter's own KV cache holds its rows in (the plan's draft_kv_cache_type)


@dataclass(frozen=True)
class DraftContext:
    tokens: Sequence[int]  # every committed token of the request; the last one is the anchor (not yet in the target)
    max_tokens: int  # the scheduled proposal budget for this round
    members: Sequence[bool] | None = None  # which chain members may propose (the cost governor's verdicts); None: all


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # [len(tokens), vocab] draft distributions each token was drawn from; None means each is a certain (one-hot) guess.
    probs: torch.Tensor | None = None
    # True when a learned head ran: a pass that proposed nothing still cost a head pass (the governor counts it).
    head_ran: bool = False
    # The chain member whose pass this was: the one that proposed, or the last that ran (0 for a lone speculator).
    member: int = 0
    # Seconds the pass spent catching up on rows that landed while it did not propose (the cost governor charges the
    # member for them, and expects more of them the more rows it has missed).
    upkeep_s: float = 0.0


class Speculator:
    """Base class: a weight-free speculator needs no taps and keeps no state worth checkpointing beyond what it says."""

    name: str = ""
    # Target layers whose entering residual the speculator reads (n_layers = the final residual before the norm).
    taps: tuple[int, ...] = ()
    # The most tokens one proposal can hold (a block drafter's block); None: as many as asked for.
    max_proposals: int | None = None
    # How many speculators propose in turn under this one (a chain's members); the governor keeps a verdict for each.
    member_count: int = 1
    # The most recent committed rows the speculator reads (a drafter's sliding window); None: the whole context.
    # Rows that land while it does not propose and fall out of it by the time it does are never handed to it.
    window_rows: int | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        """Arm for a request whose committed tokens are `tokens` (its prompt, or a reused prefix plus the prompt)."""

    def propose(self, ctx: DraftContext) -> Proposal:
        raise NotImplementedError

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        """`tokens` landed in the target at positions [start, start + len(tokens)); `hidden[L]`
        holds their tapped rows."""

    def reset(self) -> None:
        """Forget everything (a new, unrelated request)."""

    def spawn(self) -> Speculator:
        """A speculator with the same weights and settings and no state, for another sequence beside this one."""
        raise NotImplementedError(f"the {self.name or type(self).__name__} speculator serves one sequence only")

    def checkpoint(self) -> Any:
        """An opaque copy of the committed state, restored if the round fails."""
        return None

    def restore(self, checkpoint: Any) -> None:
        """Return to a checkpoint taken earlier in this request."""


def timed(work: Callable[[], None]) -> float:
    """Run `work`; the seconds it took."""
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


class Positioned(Protocol):
    """Rows kept for a speculator: positions [start, end) of the sequence."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


RowsT = TypeVar("RowsT", bound=Positioned)


def runs(queue: Sequence[RowsT]) -> list[list[RowsT]]:
    """A queue of rows in position order, cut into runs of consecutive positions (one pass each)."""
    cut: list[list[RowsT]] = []
    for rows in queue:
        if cut and rows.start == cut[-1][-1].end:
            cut[-1].append(rows)
        else:
            cut.append([rows])
    return cut


def within_window(queue: tuple[RowsT, ...], window: int | None) -> tuple[RowsT, ...]:
    """The queue without the rows a window of the last `window` positions evicts before anything reads them."""
    while window is not None and len(queue) > 1 and queue[-1].end - queue[1].start >= window:
        queue = queue[1:]
    return queue


@dataclass(frozen=True)
class Decline:
    """Why an algorithm cannot serve a model: an operator-facing reason, never a silent downgrade."""

    speculator: str
    reason: str

    def __str__(self) -> str:
        return f"speculator {self.speculator!r} declined: {self.reason}"


class SpeculatorDeclined(RuntimeInputError):
    code = "PWR603"

    def __init__(self, decline: Decline) -> None:
        super().__init__(str(decline), hint="plan a mode this target serves; Power never downgrades a requested mode")
        self.decline = decline
