"""A vocabulary's pieces, stored compactly: one UTF-8 blob, its offsets, and a hash index for lookups.

Gemma 3's 262,144 pieces as Python strings and a dict cost about 50 MiB of small
objects (and the `tokenizers` library's BPE built from them about 95 MiB more);
here they cost their UTF-8 bytes (2.2 MiB), 4 bytes of offset each and an
open-addressing index of 8-byte slots at most half full (about 7 MiB in all).
A lookup hashes the piece's bytes with Python's own `hash` (seeded per process,
which is all an in-memory index needs) and probes linearly.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import Iterator, Sequence, overload

EMPTY = -1
ID_MASK = (1 << 32) - 1
TAG_MASK = (1 << 31) - 1


class Pieces(Sequence[str]):
    """`pieces[i]` is piece i's text; `utf8(i)` its bytes; `id_of(bytes)` the id of a piece (-1 when absent).

    A piece that occurs more than once maps to its last id, as a dict built in order would map it."""

    def __init__(self, texts: Sequence[str]) -> None:
        encoded = [text.encode("utf-8") for text in texts]
        self._blob = b"".join(encoded)
        self._offsets = array("I", accumulate((len(piece) for piece in encoded), initial=0))
        # A slot holds -1 (empty) or (tag << 32) | id, the tag 31 bits of the piece's hash: most probes that meet
        # another piece are told apart by the tag, without comparing bytes.
        self._index = array("q", [EMPTY]) * (1 << max(4, (2 * len(encoded)).bit_length()))  # at most half full
        self._mask = len(self._index) - 1
        for i, piece in enumerate(encoded):
            slot, tag = self._slot(piece)
            self._index[slot] = tag << 32 | i

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.utf8(i).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def utf8(self, i: int) -> bytes:
        if not -len(self) <= i < len(self):
            raise IndexError(f"piece {i} is outside the vocabulary of {len(self)}")
        i %= len(self)
        return self._blob[self._offsets[i]:self._offsets[i + 1]]

    def id_of(self, piece: bytes) -> int:
        entry = self._index[self._slot(piece)[0]]
        return entry & ID_MASK if entry != EMPTY else -1

    @property
    def longest(self) -> int:
        """The most UTF-8 bytes of one piece."""
        offsets = self._offsets
        return max((offsets[i + 1] - offsets[i] for i in range(len(self))), default=0)

    def _slot(self, piece: bytes) -> tuple[int, int]:
        """The slot that holds `piece`, or the empty one where it would go; and the piece's tag."""
        index, offsets, blob, mask = self._index, self._offsets, self._blob, self._mask
        hashed = hash(piece)
        tag = hashed >> 33 & TAG_MASK
        slot = hashed & mask
        while (entry := index[slot]) != EMPTY:
            if entry >> 32 == tag:
                i = entry & ID_MASK
                if blob[offsets[i]:offsets[i + 1]] == piece:
                    return slot, tag
            slot = (slot + 1) & mask
        return slot, tag
