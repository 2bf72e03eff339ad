"""Weight-free n-gram (prompt lookup) speculation, with llama.cpp ngram-mod's three settings.

The lookup matches the context's last `match` tokens (`--spec-ngram-mod-n-match`)
against every earlier occurrence and proposes what followed the most recent one,
at most `draft_max` tokens (`--spec-ngram-mod-n-max`); a draft shorter than
`draft_min` (`--spec-ngram-mod-n-min`) is dropped, so a chance match on ordinary
prose proposes nothing. The round's budget (K, or less near the end of a
request) then cuts the draft. llama.cpp hashes the key and may propose on a
collision; Power compares the tokens themselves, so it proposes only on a true
match: the same drafts, minus the collisions.

The index is maintained incrementally - one entry per committed token - so a
lookup is O(1) per step, never a scan of the history. It mines the emitted token
history, which is complete whatever the target's cache did, so it survives prefix
reuse: a new request keeps the index for the prefix it shares with the last one
and rewinds only the divergent tail.
"""

from __future__ import annotations

from typing import Sequence

from power import modes

from .base import Decline, DraftContext, NGramWindow, Proposal, Speculator, SpeculatorRequest


def build(kind: str, request: SpeculatorRequest) -> Speculator | Decline:
    if request.ngram is None:
        return Decline(kind, "needs its window (the plan's runtime.ngram_match, ngram_draft_min and ngram_draft_max)")
    return NGramSpeculator(request.ngram)


class NGramSpeculator(Speculator):
    name = modes.NGRAM

    def __init__(self, window: NGramWindow) -> None:
        self.window = window
        self.history: list[int] = []
        # gram -> end indices of its occurrences (the last is the most recent); the gram ending at the final
        # history index is not indexed yet, so a lookup of the current suffix finds an earlier occurrence.
        self._index: dict[tuple[int, ...], list[int]] = {}

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
        draft = self.history[end + 1 : end + 1 + self.window.draft_max]
        if len(draft) < self.window.draft_min:
            return Proposal()
        return Proposal(tokens=draft[: ctx.max_tokens])

    def spawn(self) -> NGramSpeculator:
        return NGramSpeculator(self.window)

    def reset(self) -> None:
        self.history = []
        self._index = {}

    def checkpoint(self) -> int:
        return len(self.history)

    def restore(self, checkpoint: int) -> None:
        self._rewind(checkpoint)

    def _lookup(self) -> int | None:
        n = self.window.match
        if len(self.history) < n:
            return None
        ends = self._index.get(tuple(self.history[-n:]))
        return ends[-1] if ends else None

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
        """Index (or un-index) the gram that ends at history index `end`."""
        n = self.window.match
        if end + 1 < n:
            return
        gram = tuple(self.history[end + 1 - n : end + 1])
        ends = self._index.setdefault(gram, [])
        if add:
            ends.append(end)
        else:
            ends.pop()
            if not ends:
                del self._index[gram]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
