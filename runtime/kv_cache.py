"""The fixed-capacity key/value cache of one attention layer.

Slots are positions: position p lives in slot p. Attention always reads every
slot under a mask (see `layers.attention`), so rewinding is only a matter of the
trunk's position counter: slots past it are masked now and overwritten later.
Capacity is the context plus the largest forward shape, so the padding rows of a
forward that ends at the context limit still have somewhere to land.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_kv_heads: int, capacity: int, head_dim_k: int, head_dim_v: int, device: str = "cpu") -> None:
        self.k = torch.zeros(n_kv_heads, capacity, head_dim_k, device=device)  # [Hkv, T, hd_k]
        self.v = torch.zeros(n_kv_heads, capacity, head_dim_v, device=device)  # [Hkv, T, hd_v]

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [n, Hkv, hd] at positions [start, start + n)."""
        n = k.shape[0]
        self.k[:, start:start + n] = k.transpose(0, 1)
        self.v[:, start:start + n] = v.transpose(0, 1)
