"""The fixed-capacity key/value cache of one attention layer, and exact block-wise attention over it.

Slots are positions: position p lives in slot p. Rewinding is only a matter of
the trunk's position counter: slots past it are masked now and overwritten
later. Capacity is the context plus the largest forward shape (so the padding
rows of a forward that ends at the context limit still have somewhere to land),
rounded up to a whole number of ATTENTION_BLOCK slots.

Attention visits only the blocks that hold a slot some row of the forward may
read, so its cost follows the filled part of the cache (and a local layer's
window), not the capacity. Skipping a block changes no bit of any row's
result (see `KVCache.attend`), so a row's arithmetic still never depends on
which forward it ran in: alone, among others, or after a rewind.

Attention is per row: each product is one row's query heads of one KV head
against a block, [G, hd] x [hd, B], with the block copied into the same
contiguous layout for every row, so each product has the same shape and layout
whatever the number of rows in the forward. A [G * n, hd] product (or torch's
broadcasting matmul, which views the block for one row and copies it for
several) lets the library pick another kernel, and another summation order, at
another n: measured on the dense fixture, where a row's logits changed between
1 and 4 rows. tests/test_trunks.py checks every row count on every trunk.

The cache is cut into fixed blocks: SMALL_BLOCK slots up to slot ATTENTION_BLOCK,
so a short context computes little, then ATTENTION_BLOCK slots, so a long one
takes few steps.

Shapes: n = rows in the forward, H / Hkv = query / key-value heads, G = H / Hkv,
hd = head width, T = cache capacity in slots, B = slots in a block.
"""

from __future__ import annotations

import functools
import math
import mmap
from dataclasses import dataclass

import torch

SMALL_BLOCK = 64
ATTENTION_BLOCK = 256


@dataclass(frozen=True)
class CacheMask:
    """What the rows of one forward may read, for `KVCache.attend`.

    blocks: the cache's blocks that hold a slot some row may read, in slot order;
    additive: [n, slots the blocks span], 0 where a row may read a slot and -inf elsewhere.
    """

    blocks: tuple[slice, ...]
    additive: torch.Tensor

    def on(self, block: slice) -> torch.Tensor:
        """The additive mask over one of `blocks`, for scores [n, Hkv, G, B]: [n, 1, 1, B]."""
        first = self.blocks[0].start
        return self.additive[:, None, None, block.start - first:block.stop - first]


def causal_mask(start: int, rows: int, window: int | None = None, device: str | torch.device = "cpu") -> CacheMask:
    """Rows at positions [start, start + rows) read slot j when j <= p (and p - j < window, for a local layer)."""
    blocks = _blocks(0 if window is None else max(0, start - window + 1), start + rows - 1)
    slots = torch.arange(blocks[0].start, blocks[-1].stop, device=device)[None, :]
    q = torch.arange(start, start + rows, device=device)[:, None]
    allowed = slots <= q
    if window is not None:
        allowed &= (q - slots) < window
    additive = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
    return CacheMask(blocks, additive)


def _blocks(first_slot: int, last_slot: int) -> tuple[slice, ...]:
    """The blocks that hold slots [first_slot, last_slot]: SMALL_BLOCK-wide below slot ATTENTION_BLOCK, then
    ATTENTION_BLOCK-wide, each starting at a multiple of its width."""
    blocks, slot = [], first_slot
    while slot <= last_slot:
        width = SMALL_BLOCK if slot < ATTENTION_BLOCK else ATTENTION_BLOCK
        begin = slot // width * width
        blocks.append(slice(begin, begin + width))
        slot = begin + width
    return tuple(blocks)


class KVCache:
    def __init__(self, n_kv_heads: int, capacity: int, head_dim_k: int, head_dim_v: int, device: str = "cpu") -> None:
        slots = -(-capacity // ATTENTION_BLOCK) * ATTENTION_BLOCK
        self.k = _zeros((n_kv_heads, slots, head_dim_k), device)  # [Hkv, T, hd_k]
        self.v = _zeros((n_kv_heads, slots, head_dim_v), device)  # [Hkv, T, hd_v]

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [n, Hkv, hd] at positions [start, start + n)."""
        n = k.shape[0]
        self.k[:, start:start + n] = k.transpose(0, 1)
        self.v[:, start:start + n] = v.transpose(0, 1)

    def attend(self, q: torch.Tensor, mask: CacheMask, scale: float) -> torch.Tensor:
        """q [n, H, hd] against the readable blocks under `mask` -> [n, H * hd_v].

        Softmax in fixed blocks, exactly: each block's scores are products of
        fixed shape, one per row and KV head, the maximum is taken over every
        visited block, and the blocks' exponential sums and value products are
        added in slot order. A block a row may not read gives that row exact
        zeros, which leave a sum unchanged, so the blocks a forward skips or
        visits beyond a row's own never move its bits.
        """
        n, n_heads, head_dim = q.shape
        n_kv = self.k.shape[0]
        group = n_heads // n_kv
        q = q.reshape(n * n_kv, group, head_dim)  # one [G, hd] query block per row and KV head
        scores = [torch.bmm(q, _per_row(self.k[:, s], n).transpose(1, 2)).view(n, n_kv, group, -1)
                  .mul_(scale).add_(mask.on(s)) for s in mask.blocks]  # each [n, Hkv, G, B]
        peak = functools.reduce(torch.maximum, [s.amax(-1, keepdim=True) for s in scores])  # [n, Hkv, G, 1]
        weights = [s.sub_(peak).exp_() for s in scores]
        total = functools.reduce(torch.add, [w.sum(-1, keepdim=True) for w in weights])  # [n, Hkv, G, 1]
        out = functools.reduce(torch.add, [torch.bmm(w.view(n * n_kv, group, -1), _per_row(self.v[:, s], n))
                                           for w, s in zip(weights, mask.blocks, strict=True)])
        return out.view(n, n_kv, group, -1).div_(total).reshape(n, -1)  # [n, H * hd_v]


def _per_row(block: torch.Tensor, rows: int) -> torch.Tensor:
    """A cache block [Hkv, B, hd] once per row, [rows * Hkv, B, hd], contiguous: every row's product reads the same
    layout whatever the number of rows."""
    n_kv, width, head_dim = block.shape
    return block.unsqueeze(0).expand(rows, n_kv, width, head_dim).reshape(rows * n_kv, width, head_dim).contiguous()


def _zeros(shape: tuple[int, int, int], device: str) -> torch.Tensor:
    """float32 zeros on `device`. On the CPU they are a fresh anonymous memory map, whose pages the kernel gives
    zero-filled on first touch: the cache's resident memory then follows the positions written (and the blocks
    attention reads), up to its capacity, where `torch.zeros` would write every page at once."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, device=device)
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * 4), dtype=torch.float32).view(shape)
