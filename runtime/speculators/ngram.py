"""Weight-free n-gram (prompt lookup) speculation.

Drafts by finding the most recent earlier occurrence of the context's last n
tokens and proposing what followed it, trying the longest order first. The index
is maintained incrementally - one entry per order per committed token - so a
lookup is O(1) per step, never a scan of the history. It mines the emitted token
history, which is complete whatever the target's cache did, so it survives prefix
reuse: a new request keeps the index for the prefix it shares with the last one
and rewinds only the divergent tail.
"""

from __future__ import annotations

from typing import Sequence

from power import modes

from .base import Decline, DraftContext, Proposal, Speculator, SpeculatorRequest


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    if request.ngram_orders is None:
        return Decline(kind, "needs its match lengths (the plan's runtime.ngram_n_min and ngram_n_max)")
    return NGramSpeculator(*request.ngram_orders)


class NGramSpeculator(Speculator):
    name = modes.NGRAM

    def __init__(self, min_order: int, max_order: int) -> None:
        if not 1 <= min_order <= max_order:
            raise ValueError(f"n-gram orders need 1 <= min_order <= max_order, got {min_order}..{max_order}")
        self.orders = tuple(range(max_order, min_order - 1, -1))
        self.history: list[int] = []
        # order -> gram -> end indices of its occurrences (the last is the most recent); grams ending at the final
        # history index are not indexed yet, so a lookup of the current suffix finds an earlier occurrence.
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.orders}

    def begin(self, tokens: Sequence[int]) -> None:
        self._rewind(common_prefix_length(self.history, tokens))
        self._extend(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        self._extend(ctx.tokens)
        if ctx.max_tokens <= 0:
            return Proposal()
        end = self._lookup()
        if end is None:
            return Proposal()
        return Proposal(tokens=self.history[end + 1 : end + 1 + ctx.max_tokens])

    def reset(self) -> None:
        self.history = []
        self._index = {n: {} for n in self.orders}

    def checkpoint(self) -> int:
        return len(self.history)

    def restore(self, checkpoint: int) -> None:
        self._rewind(checkpoint)

    def _lookup(self) -> int | None:
        for n in self.orders:
            if len(self.history) < n:
                continue
            ends = self._index[n].get(tuple(self.history[-n:]))
            if ends:
                return ends[-1]
        return None

    def _extend(self, tokens: Sequence[int]) -> None:
        if len(tokens) < len(self.history):
            raise ValueError(f"n-gram history ({len(self.history)} tokens) is ahead of the request ({len(tokens)})")
        for token in tokens[len(self.history) :]:
            if self.history:
                self._index_end(len(self.history) - 1, add=True)
            self.history.append(token)

    def _rewind(self, length: int) -> None:
        while len(self.history) > length:
            self.history.pop()
            if self.history:
                self._index_end(len(self.history) - 1, add=False)

    def _index_end(self, end: int, add: bool) -> None:
        """Index (or un-index) every gram that ends at history index `end`."""
        for n in self.orders:
            if end + 1 < n:
                continue
            gram = tuple(self.history[end + 1 - n : end + 1])
            ends = self._index[n].setdefault(gram, [])
            if add:
                ends.append(end)
            else:
                ends.pop()
                if not ends:
                    del self._index[n][gram]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
