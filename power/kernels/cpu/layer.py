"""A Gemma 3 layer over a forward's rows as one kernel call on the CPU (csrc/layer.cpp).

API
---
- `Gemma3LayerKernel(norms, matrices, shape, eps, scale, window)`: norms the five float32 weights (attention, the
  stacked q/k norm [H + Hkv, hd], post-attention, FFN, post-FFN), matrices the layer's four (q/k/v, output, gate/up,
  down), each the `QuantMatrix` products whose outputs lie side by side, shape (H, Hkv, hd, hd_v, d_ff), window 0
  for a global layer.
  - `kernel(h, cos, sin, k_caches, v_caches, slots, positions)`: h [n, d] after the layer, every row's key and value
    written to its slot's caches ([S, Hkv, T, stored width], `power.runtime.kv_cache.SlotCaches`) at its position.

What it computes: exactly `power.runtime.trunks.gemma3.gemma3_layer` over the trunk's caches, the ops the Python
layer calls one by one (the products, `power.kernels.cpu.rowops`' norms, rope and attention, torch's gelu, adds and
products' concatenation) in the same order on the same values, so the same bits; the cache rows are rounded as
`power.runtime.kv_rows.encode` rounds them (tests/test_kernel_cpu_layer.py checks both on every KV type). It saves
the Python and the dispatch around some thirty small operations a layer: a decode step of the bundled Gemma 3 270M
made about 380 torch calls outside the products (docs/runtime.md, "One call a layer").
"""

from __future__ import annotations

from typing import Sequence

import torch

from power.kernels.cpu import QuantMatrix
from power.kernels.cpu.build import extension


class Gemma3LayerKernel:
    def __init__(self, norms: Sequence[torch.Tensor], matrices: Sequence[Sequence[QuantMatrix]],
                 shape: tuple[int, int, int, int, int], eps: float, scale: float, window: int) -> None:
        paths = {m.path for parts in matrices for m in parts}
        if len(norms) != 5 or len(matrices) != 4 or len(paths) != 1:
            raise ValueError("Gemma3LayerKernel: five norms and four matrices, every product on one instruction path")
        self._norms = [norm.float().contiguous() for norm in norms]
        self._packed: list[torch.Tensor] = []
        self._products: list[int] = []
        for index, parts in enumerate(matrices):
            for m in parts:
                kind, tiles, every_tile = m.operands
                self._packed += [tiles, every_tile]
                self._products += [index, kind, m.shape[1], m.shape[0]]
        self._shape, self._eps, self._scale, self._window = list(shape), eps, scale, window
        self._op = extension(paths.pop()).gemma3_layer.default

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_caches: torch.Tensor,
                 v_caches: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._op(h, self._norms, self._packed, self._products, self._shape, self._eps, self._scale,
                        self._window, cos, sin, k_caches, v_caches, slots, positions)
