"""SentencePiece BPE (`tokenizer.ggml.model = llama`, e.g. Gemma) over a compact vocabulary.

The algorithm of llama.cpp's `llm_tokenizer_spm` (src/llama-vocab.cpp):

1. Control and user-defined pieces match verbatim in the raw text, leftmost and
   longest first (`power.runtime.verbatim`, before this module sees the text).
2. In each fragment between them, spaces become "▁" and the text is cut into
   its characters; then, as long as some adjacent pair concatenates to a piece,
   the pair whose piece scores highest merges (the leftmost on equal scores).
3. Each final symbol is its piece; a character that is no piece becomes the
   `<0xXX>` pieces of its UTF-8 bytes.

The vocabulary is a `power.runtime.pieces.Pieces` (a blob and an index, not a
dict of strings), the types one byte each and the scores an array of floats.
"""

from __future__ import annotations

import heapq
import re
import time
from array import array

from power.runtime.pieces import Pieces

SPM_SPACE = "▁"
CHECK_EVERY = 4096  # merge steps between looks at the clock (about a millisecond of work)
_CHARACTER = re.compile(rb"[^\x80-\xbf]")  # where a UTF-8 character starts


class SentencePiece:
    """encode(fragment) -> piece ids, by steps 2 and 3 above."""

    def __init__(self, pieces: Pieces, scores: array) -> None:
        self._pieces, self._scores = pieces, scores
        self._bytes = [pieces.id_of(f"<0x{byte:02X}>".encode()) for byte in range(256)]

    def encode(self, fragment: str, deadline: float | None = None) -> list[int]:
        """The ids of text between verbatim pieces; TimeoutError once `deadline` (a `time.perf_counter()` instant)
        has passed, checked every CHECK_EVERY steps."""
        return self._merged(fragment.replace(" ", SPM_SPACE).encode("utf-8"), deadline)

    def _merged(self, data: bytes, deadline: float | None) -> list[int]:
        """One fragment's UTF-8 bytes -> ids: its characters merged pair by pair, best score first."""
        start = [found.start() for found in _CHARACTER.finditer(data)]
        n = len(start)
        end = start[1:] + [len(data)]
        after = list(range(1, n + 1))  # the next live symbol (n: none)
        before = list(range(-1, n - 1))  # the previous live symbol (-1: none)
        alive = [True] * n
        id_of, scores = self._pieces.id_of, self._scores
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, the pair's end)

        def offer(left: int, right: int) -> None:
            piece = id_of(data[start[left]:end[right]])
            if piece >= 0:
                heapq.heappush(queue, (-scores[piece], left, right, end[right]))

        for left in range(n - 1):
            offer(left, left + 1)
            if not left % CHECK_EVERY:
                within(deadline)
        steps = 0
        while queue:
            steps += 1
            if not steps % CHECK_EVERY:
                within(deadline)
            _, left, right, pair_end = heapq.heappop(queue)
            if not (alive[left] and alive[right] and after[left] == right and end[right] == pair_end):
                continue  # one of the two merged since the pair was offered
            end[left], alive[right] = pair_end, False
            after[left] = after[right]
            if after[left] < n:
                before[after[left]] = left
                offer(left, after[left])
            if before[left] >= 0:
                offer(before[left], left)
        ids: list[int] = []
        symbol = 0
        while symbol < n:
            piece = id_of(data[start[symbol]:end[symbol]])
            ids += [piece] if piece >= 0 else [self._byte(byte) for byte in data[start[symbol]:end[symbol]]]
            symbol = after[symbol]
        return ids

    def _byte(self, byte: int) -> int:
        piece = self._bytes[byte]
        if piece < 0:
            raise ValueError(f"the vocabulary has no <0x{byte:02X}> piece for a character it does not hold")
        return piece


def within(deadline: float | None) -> None:
    """TimeoutError once `deadline` (a `time.perf_counter()` instant) has passed: a request's
    tokenizing ends with it."""
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError("tokenizing ran past the request's time")
