"""How the rows of one forward map to sequences, and what runs once per sequence.

A forward runs `rows` rows: its real rows only (a trunk whose every op is row-count
invariant), or the fixed shape (the verification capacity, or the prefill chunk).
Its real rows come in segments, one per sequence (a slot of the trunk): rows
[row, row + n) hold that slot's positions [start, start + n); in a padded forward
the rows after the last segment are padding. Everything row-wise (embeddings,
norms, matrix products, rope, activations) runs once over all the rows, where a
row's result never depends on the other rows. What reads a sequence's history
runs once per segment, as a forward of that sequence alone would run it:

- attention (the CPU path): the segment's keys and values go into its own slot's
  cache, and each of its rows attends there by the row kernel
  (`power.kernels.cpu.rowops.attention`), over the slots up to its position, as
  it would alone; padding rows attend to nothing;
- a recurrent layer runs the segment's rows through its own slot's state.

So a row's bits never depend on which other sequences shared its forward, how
many rows they took, or where in the forward its segment sits. Padding rows
write nothing: no cache slot, no recurrent state.

On the GPU path (`kernels`) attention runs once over all the rows instead:
`power.kernels.dispatch.cache_write` and `.attention` read each row's slot and
position from device tensors (`DeviceRows`), one program per row, so a row's
bits do not depend on the other rows either (docs/kernels.md). A forward whose
layers read nothing else from its rows (the attention-only trunks) runs from a
bare `DeviceRows`, which is what a CUDA graph captures and replays with new
slots and positions (`power.runtime.cuda_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from power.kernels import dispatch
from power.runtime.kv_cache import SlotCaches

PADDING_SLOT = -1  # a padding row's slot: the kernels write nothing for it and give it zeros


@dataclass(frozen=True)
class Segment:
    """One sequence's real rows in a forward: rows [row, row + n) at its positions [start, start + n)."""

    slot: int
    row: int
    n: int
    start: int

    @property
    def rows(self) -> slice:
        return slice(self.row, self.row + self.n)


class DeviceRows:
    """The rows of a forward as the GPU path reads them: `rows`, and per row its position and slot (PADDING_SLOT for
    a padding row) as int64 device tensors [rows]."""

    def __init__(self, rows: int, positions: torch.Tensor, slots: torch.Tensor) -> None:
        self.rows, self.positions, self.slots = rows, positions, slots

    def attend(self, caches: SlotCaches, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               window: int | None = None) -> torch.Tensor:
        """q [rows, H, hd], k/v [rows, Hkv, hd]: write every real row's k/v at its slot and position, then attend
        each row to its slot's cache. Returns [rows, H * hd_v]; padding rows are zeros."""
        dispatch.cache_write(k.contiguous(), v.contiguous(), caches.k, caches.v, self.slots, self.positions)
        return dispatch.attention(q.contiguous(), caches.k, caches.v, self.slots, self.positions, scale, window or 0)


class RowBatch(DeviceRows):
    """The segments of one forward of `rows` rows, with the per-row positions and slots.

    `prefill`: a prefill chunk forward (each segment's rows are prompt rows of its sequence); rows past the segments
    are padding (a forward at a fixed shape). `kernels`: attention through the GPU path's
    kernels (`DeviceRows.attend`), else per segment through `KVCache.attend_rows` (the CPU path).
    """

    def __init__(self, rows: int, segments: Sequence[Segment], device: str | torch.device = "cpu",
                 prefill: bool = False, kernels: bool = False) -> None:
        positions = torch.zeros(rows, dtype=torch.long)  # padding rows sit at position 0 (they write nothing)
        slots = torch.full((rows,), PADDING_SLOT, dtype=torch.long)
        for segment in segments:
            positions[segment.rows] = torch.arange(segment.start, segment.start + segment.n)
            slots[segment.rows] = segment.slot
        super().__init__(rows, positions.to(device), slots.to(device))
        self.segments, self.device, self.prefill = tuple(segments), device, prefill
        self.kernels = kernels

    def attend(self, caches: SlotCaches, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               window: int | None = None) -> torch.Tensor:
        """q [rows, H, hd], k/v [rows, Hkv, hd]: write each segment's k/v to its slot's cache and attend there.

        Returns [rows, H * hd_v]; padding rows are zeros.
        """
        if self.kernels:
            return super().attend(caches, q, k, v, scale, window)
        out = q.new_zeros(self.rows, q.shape[1] * v.shape[2])
        for segment in self.segments:
            cache = caches[segment.slot]
            cache.write(segment.start, k[segment.rows], v[segment.rows])
            out[segment.rows] = cache.attend_rows(q[segment.rows], self.positions[segment.rows], scale, window)
        return out
