"""The fixed-capacity key/value caches of one attention layer, and exact attention over them.

On the CPU a row attends through `power.kernels.cpu.rowops.attention` (`KVCache.attend_rows`): one fixed
float order per row over exactly the slots it may read (the slots up to its position, the last `window`
of them for a sliding layer), so its bits never depend on the forward it ran in, and its cost follows the
filled part of the cache, not the capacity. On the GPU path every row attends through
`power.kernels.dispatch.attention` over the layer's `SlotCaches` (`power.runtime.trunks.batch.DeviceRows`).

Slots are positions: position p lives in slot p. Rewinding is only a matter of
the trunk's position counter: slots past it are never read and are overwritten
later. Capacity is the context plus the largest forward shape (so the padding
rows of a forward that ends at the context limit still have somewhere to land),
rounded up to a whole number of ATTENTION_BLOCK slots.

Shapes: n = rows in the forward, H / Hkv = query / key-value heads, hd = head width, T = cache capacity in
slots.
"""

from __future__ import annotations

import math
import mmap
from typing import Iterator

import torch

from power.kernels.cpu import rowops

ATTENTION_BLOCK = 256


def padded_capacity(capacity: int) -> int:
    """Cache slots for `capacity` positions: a whole number of ATTENTION_BLOCK slots."""
    return -(-capacity // ATTENTION_BLOCK) * ATTENTION_BLOCK


class KVCache:
    """One sequence's keys and values: k [Hkv, T, hd_k], v [Hkv, T, hd_v] (views of a `SlotCaches`' tensors when the
    sequence is one slot of a trunk)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [n, Hkv, hd] at positions [start, start + n)."""
        n = k.shape[0]
        self.k[:, start:start + n] = k.transpose(0, 1)
        self.v[:, start:start + n] = v.transpose(0, 1)

    def attend_rows(self, q: torch.Tensor, positions: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
        """On the CPU: q [n, H, hd] at `positions` [n], each row over the slots up to its position (the last
        `window` of them for a sliding layer) -> [n, H * hd_v], by `power.kernels.cpu.rowops.attention`."""
        return rowops.attention(q, self.k, self.v, positions, window, scale)


class SlotCaches:
    """One attention layer's caches for every slot of a trunk: k [S, Hkv, T, hd_k], v [S, Hkv, T, hd_v] in one tensor
    each (the GPU path's kernels index them by each row's slot), and slot s as the `KVCache` views k[s], v[s]."""

    def __init__(self, slots: int, n_kv_heads: int, capacity: int, head_dim_k: int, head_dim_v: int,
                 device: str = "cpu") -> None:
        positions = padded_capacity(capacity)
        self.k = _zeros((slots, n_kv_heads, positions, head_dim_k), device)
        self.v = _zeros((slots, n_kv_heads, positions, head_dim_v), device)
        self._slots = [KVCache(self.k[s], self.v[s]) for s in range(slots)]

    def __getitem__(self, slot: int) -> KVCache:
        return self._slots[slot]

    def __iter__(self) -> Iterator[KVCache]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


def _zeros(shape: tuple[int, ...], device: str) -> torch.Tensor:
    """float32 zeros on `device`. On the CPU they are a fresh anonymous memory map, whose pages the kernel gives
    zero-filled on first touch: the cache's resident memory then follows the positions written, up to its
    capacity, where `torch.zeros` would write every page at once."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, device=device)
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * 4), dtype=torch.float32).view(shape)
