"""A drafter's own KV cache: a ring of `rows` positions (its sliding window, or the whole context).

Position p lives in slot p % rows. Writing positions past the window evicts the
oldest ones, so a restore to an earlier extent must not be read until the rows
written since are written again (the Gemma SWA lesson in TensorSharp's design
notes): the block drafter writes only rows it keeps queued in its checkpoint, and
catches them up again before it reads the window (`power.runtime.speculators.dflash`).
"""

from __future__ import annotations

import torch


class KVRing:
    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int) -> None:
        self.rows = rows
        self.keys = torch.zeros(layers, rows, kv_heads, head_dim)
        self.values = torch.zeros(layers, rows, kv_heads, head_dim)
        self.first = 0  # positions before it were never written (a gap: an adopted prefix)
        self.length = 0  # positions written: [first, length)

    def empty_like(self) -> KVRing:
        """A ring of the same shape, holding nothing."""
        layers, rows, kv_heads, head_dim = self.keys.shape
        return KVRing(layers, rows, kv_heads, head_dim)

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values [layers, n, kv_heads, head_dim] for positions [start, start + n)."""
        if start != self.length:
            raise ValueError(f"drafter KV ring holds {self.length} positions; a write at {start} would leave a gap")
        n = keys.shape[1]
        keep = min(n, self.rows)
        slots = torch.arange(start + n - keep, start + n) % self.rows
        self.keys[:, slots] = keys[:, n - keep :]
        self.values[:, slots] = values[:, n - keep :]
        self.length = start + n

    def window(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The resident positions in order: (keys [n, kv_heads, hd], values, positions [n])."""
        first = max(self.first, self.length - self.rows)
        positions = torch.arange(first, self.length)
        slots = positions % self.rows
        return self.keys[layer, slots], self.values[layer, slots], positions

    @property
    def extent(self) -> tuple[int, int]:
        """The positions written, [first, length)."""
        return self.first, self.length

    @extent.setter
    def extent(self, extent: tuple[int, int]) -> None:
        self.first, self.length = extent

    def jump(self, position: int) -> None:
        """Start over at `position`: nothing before it is resident."""
        self.first = self.length = position

    def reset(self) -> None:
        self.jump(0)
