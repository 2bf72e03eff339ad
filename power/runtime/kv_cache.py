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
rounded up to whole cache blocks (`power.documents.geometry.padded_capacity`).

Rows are held in the plan's KV type (`power.documents.kv_types`): each row is rounded to it as it is written, by
itself (`power.runtime.kv_rows`), and attention reads the rounded values back exactly, on both paths (the GPU path
holds f32, f16 and bf16; q8_0 is the CPU path's).

Shapes: n = rows in the forward, H / Hkv = query / key-value heads, hd = head width, T = cache capacity in
slots.
"""

from __future__ import annotations

import math
import mmap
from typing import Iterator

import torch

from power.documents.geometry import padded_capacity
from power.documents.kv_types import F32, Q8_0, RUNTIME_KV_TYPES, whole_blocks
from power.kernels.cpu import rowops
from power.runtime import kv_rows
from power.runtime.errors import RuntimeInputError


class KVCache:
    """One sequence's keys and values: k [Hkv, T, hd_k], v [Hkv, T, hd_v] as stored rows of `kv_type`
    (`power.runtime.kv_rows`; views of a `SlotCaches`' tensors when the sequence is one slot of a trunk)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, kv_type: str = F32) -> None:
        self.k, self.v, self.kv_type = k, v, kv_type

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [n, Hkv, hd] at positions [start, start + n) (on the CPU by `rowops.cache_write`, the rounding
        of `kv_rows.encode` bit for bit)."""
        n = k.shape[0]
        if self.k.device.type == "cpu" and k.dtype == torch.float32:
            positions = torch.arange(start, start + n)
            slots = torch.zeros(n, dtype=torch.int64)
            rowops.cache_write(k, self.k.unsqueeze(0), slots, positions)
            rowops.cache_write(v, self.v.unsqueeze(0), slots, positions)
            return
        self.k[:, start:start + n] = kv_rows.encode(k, self.kv_type).transpose(0, 1)
        self.v[:, start:start + n] = kv_rows.encode(v, self.kv_type).transpose(0, 1)

    def attend_rows(self, q: torch.Tensor, positions: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
        """On the CPU: q [n, H, hd] at `positions` [n], each row over the slots up to its position (the last
        `window` of them for a sliding layer) -> [n, H * hd_v], by `power.kernels.cpu.rowops.attention`."""
        return rowops.attention(q, self.k, self.v, positions, window, scale)


class SlotCaches:
    """One attention layer's caches for every slot of a trunk: k [S, Hkv, T, hd_k], v [S, Hkv, T, hd_v] in one tensor
    each (the GPU path's kernels index them by each row's slot), and slot s as the `KVCache` views k[s], v[s]; rows
    stored in `kv_type`."""

    def __init__(self, slots: int, n_kv_heads: int, capacity: int, head_dim_k: int, head_dim_v: int,
                 device: str = "cpu", kv_type: str = F32) -> None:
        check_kv_type(kv_type, head_dim_k, head_dim_v)
        positions = padded_capacity(capacity)
        self.kv_type = kv_type
        self.k = _zeros((slots, n_kv_heads, positions, kv_rows.stored_width(kv_type, head_dim_k)), kv_type, device)
        self.v = _zeros((slots, n_kv_heads, positions, kv_rows.stored_width(kv_type, head_dim_v)), kv_type, device)
        self._slots = [KVCache(self.k[s], self.v[s], kv_type) for s in range(slots)]

    def __getitem__(self, slot: int) -> KVCache:
        return self._slots[slot]

    def __iter__(self) -> Iterator[KVCache]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


def check_kv_type(kv_type: str, *widths: int) -> None:
    """Refuse a KV type the runtime does not hold, or q8_0 rows that are not whole blocks: never another type."""
    if kv_type not in RUNTIME_KV_TYPES:
        raise RuntimeInputError(f"kv_cache_type {kv_type!r} is not a type Power's runtime holds its caches in "
                                f"({', '.join(RUNTIME_KV_TYPES)})", code="PWR512",
                                hint=f"set the profile's runtime.kv_cache_type to one of {', '.join(RUNTIME_KV_TYPES)}")
    if not all(whole_blocks(kv_type, width) for width in widths):
        raise RuntimeInputError(f"kv_cache_type {kv_type!r} stores blocks of 32 values; this model's key/value head "
                                f"widths {'/'.join(map(str, widths))} are not whole blocks", code="PWR513",
                                hint="set the profile's runtime.kv_cache_type to f16, bf16 or f32")


def check_device_kv_type(kv_type: str, kernels: bool) -> None:
    """The GPU path's attention kernels read float caches: refuse q8_0 there rather than hold another type."""
    if kernels and kv_type == Q8_0:
        raise RuntimeInputError("kv_cache_type \"q8_0\" is held by the CPU path's attention only; the GPU path "
                                "reads f32, f16 and bf16 caches", code="PWR514",
                                hint="set the profile's runtime.kv_cache_type to f16 or bf16, or run on the CPU")


def _zeros(shape: tuple[int, ...], kv_type: str, device: str) -> torch.Tensor:
    """Zeros of `kv_type`'s stored rows on `device`. On the CPU they are a fresh anonymous memory map, whose pages the
    kernel gives zero-filled on first touch: the cache's resident memory then follows the positions written, up to
    its capacity, where `torch.zeros` would write every page at once."""
    dtype = kv_rows.DTYPES[kv_type]
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * dtype.itemsize), dtype=dtype).view(shape)
