"""A drafter's own KV cache: a ring of `rows` positions (its sliding window, or the whole context).

Position p lives in slot p % rows. Writing positions past the window evicts the
oldest ones, so a checkpoint saves the slots the next writes may overwrite, not
just the length: restoring must bring evicted rows back (the Gemma SWA lesson in
TensorSharp's design notes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RingCheckpoint:
    first: int
    length: int
    slots: torch.Tensor  # slot indices saved
    keys: torch.Tensor
    values: torch.Tensor


class KVRing:
    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, guard_rows: int) -> None:
        self.rows = rows
        self.guard_rows = guard_rows  # how many positions one commit may write (saved by `checkpoint`)
        self.keys = torch.zeros(layers, rows, kv_heads, head_dim)
        self.values = torch.zeros(layers, rows, kv_heads, head_dim)
        self.first = 0  # positions before it were never written (a gap: an adopted prefix)
        self.length = 0  # positions written: [first, length)

    def empty_like(self) -> KVRing:
        """A ring of the same shape, holding nothing."""
        layers, rows, kv_heads, head_dim = self.keys.shape
        return KVRing(layers, rows, kv_heads, head_dim, self.guard_rows)

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

    def checkpoint(self) -> RingCheckpoint:
        slots = torch.arange(self.length, self.length + min(self.guard_rows, self.rows)) % self.rows
        return RingCheckpoint(self.first, self.length, slots, self.keys[:, slots].clone(), self.values[:, slots].clone())

    def restore(self, checkpoint: RingCheckpoint) -> None:
        self.keys[:, checkpoint.slots] = checkpoint.keys
        self.values[:, checkpoint.slots] = checkpoint.values
        self.first, self.length = checkpoint.first, checkpoint.length

    def jump(self, position: int) -> None:
        """Start over at `position`: nothing before it is resident."""
        self.first = self.length = position

    def reset(self) -> None:
        self.jump(0)
