"""SentencePiece BPE (`tokenizer.ggml.model = llama`, e.g. Gemma) over a compact vocabulary.

The algorithm of llama.cpp's `llm_tokenizer_spm` (src/llama-vocab.cpp):

1. Control and user-defined pieces match verbatim in the raw text, leftmost and
   longest first (as the `tokenizers` library matches added tokens; llama.cpp's
   longest-first partition splits the same way unless two such pieces overlap).
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
from array import array
from typing import Iterable

from power.runtime.pieces import Pieces

SPM_SPACE = "▁"
_CHARACTER = re.compile(rb"[^\x80-\xbf]")  # where a UTF-8 character starts


class Verbatim:
    """Pieces matched verbatim in raw text, leftmost first and, at one place, longest first."""

    def __init__(self, pieces: Iterable[tuple[str, int]]) -> None:
        self._ids = {text: i for text, i in pieces if text}  # a repeated text keeps its last id
        lengths: dict[str, set[int]] = {}
        for text in self._ids:
            lengths.setdefault(text[:2], set()).add(len(text))
        self._lengths = {prefix: sorted(found, reverse=True) for prefix, found in lengths.items()}
        firsts = sorted({text[0] for text in self._ids})
        self._starts = re.compile("[" + "".join(re.escape(ch) for ch in firsts) + "]") if firsts else None

    def split(self, text: str) -> list[tuple[str, int | None]]:
        """`text` as fragments: (a verbatim piece, its id) or (the text between them, None)."""
        parts: list[tuple[str, int | None]] = []
        begin = i = 0
        while self._starts is not None and (found := self._starts.search(text, i)) is not None:
            at = found.start()
            match = self._longest(text, at)
            if match is None:
                i = at + 1
                continue
            if begin < at:
                parts.append((text[begin:at], None))
            parts.append(match)
            begin = i = at + len(match[0])
        if begin < len(text):
            parts.append((text[begin:], None))
        return parts

    def _longest(self, text: str, at: int) -> tuple[str, int] | None:
        for prefix in (text[at:at + 2], text[at]):  # pieces of two or more characters first, then of one
            for length in self._lengths.get(prefix, ()):
                piece = text[at:at + length]
                if piece in self._ids:
                    return piece, self._ids[piece]
        return None


class SentencePiece:
    """encode(text) -> piece ids, by the algorithm above."""

    def __init__(self, pieces: Pieces, scores: array, verbatim: Verbatim) -> None:
        self._pieces, self._scores, self._verbatim = pieces, scores, verbatim
        self._bytes = [pieces.id_of(f"<0x{byte:02X}>".encode()) for byte in range(256)]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for fragment, token in self._verbatim.split(text):
            if token is not None:
                ids.append(token)
            else:
                ids += self._merged(fragment.replace(" ", SPM_SPACE).encode("utf-8"))
        return ids

    def _merged(self, data: bytes) -> list[int]:
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
        while queue:
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
