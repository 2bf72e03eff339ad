"""A chain of speculators, as llama.cpp runs `--spec-type ngram-mod,dspark`: each round the weight-free lookup
proposes first, and the learned drafter only when the lookup has nothing (common/speculative.cpp tries the
speculative types in order and keeps the first draft that is not empty).

Every member sees every committed token (the lookup's index and the drafter's cache both track the target), so
whichever proposes next round starts from the truth. The transaction verifies whatever is proposed, so greedy
output is the target's either way. A member the cost governor has parked is skipped (`DraftContext.members`), and
the proposal names the member whose pass it was, so each member is governed on its own costs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .base import DraftContext, Proposal, Speculator


class ChainSpeculator(Speculator):
    def __init__(self, members: Sequence[Speculator]) -> None:
        self.members = tuple(members)
        self.name = " -> ".join(member.name for member in self.members)
        self.taps = tuple(sorted({tap for member in self.members for tap in member.taps}))
        limits = [member.max_proposals for member in self.members if member.max_proposals is not None]
        self.max_proposals = min(limits) if limits else None  # one K for the round, whichever member proposes
        self.member_count = len(self.members)
        windows = [member.window_rows for member in self.members if member.taps]  # a lookup reads no rows
        bounded = [window for window in windows if window is not None]
        self.window_rows = max(bounded) if bounded and len(bounded) == len(windows) else None

    def begin(self, tokens: Sequence[int]) -> None:
        for member in self.members:
            member.begin(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        proposal, ran, last, upkeep_s = Proposal(), False, 0, 0.0
        allowed = ctx.members or (True,) * len(self.members)
        for index, member in enumerate(self.members):
            if not allowed[index]:
                continue
            proposal, last = member.propose(ctx), index
            ran, upkeep_s = ran or proposal.head_ran, upkeep_s + proposal.upkeep_s
            if proposal.tokens:
                break
        proposal.head_ran, proposal.member, proposal.upkeep_s = ran, last, upkeep_s
        return proposal

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        for member in self.members:
            member.commit(tokens, hidden, start)

    def reset(self) -> None:
        for member in self.members:
            member.reset()

    def spawn(self) -> Speculator:
        return ChainSpeculator([member.spawn() for member in self.members])

    def checkpoint(self) -> Any:
        return tuple(member.checkpoint() for member in self.members)

    def restore(self, checkpoint: Any) -> None:
        for member, state in zip(self.members, checkpoint, strict=True):
            member.restore(state)
