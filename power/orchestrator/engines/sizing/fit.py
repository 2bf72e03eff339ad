"""The largest context that fits, and the layer split that fits before a context is cut, for one engine's sizer."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from power.orchestrator.engines.sizing.model import DeviceSizing, Request, Sizing

# An engine's sizing of a request on the deployment's devices (`EngineAdapter.size` with the artifacts bound).
Sizer = Callable[[Request], Sizing]


def largest_context(size: Sizer, request: Request, limit: int) -> int | None:
    """The largest ctx up to `limit` for which every device fits under its headroom; None when not even ctx 1 does.

    Every component is monotone in ctx (cells, padded per-slot contexts, batch clamps and compute terms only grow
    with it), so a binary search finds the boundary."""
    def fits(ctx: int) -> bool:
        return size(replace(request, ctx=ctx)).margin_bytes >= 0

    if not fits(1):
        return None
    if fits(limit):
        return limit
    low, high = 1, limit
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fitting_split(size: Sizer, request: Request, devices: int, layers: int) -> tuple[int, ...] | None:
    """A llama.cpp layer split (`-ts`, as layer counts) over `devices` devices under which every device fits at the
    requested context, the one leaving the largest smallest margin; None when no split fits.

    The offloaded units (the `layers` blocks, then the output layer) go to the devices in order, so a split is a run
    of counts; two devices try every boundary, more devices fill each device in turn with as many layers as fit."""
    offloadable = layers + 1  # the blocks and the output layer
    units = offloadable if request.gpu_layers is None else min(request.gpu_layers, offloadable)

    def sized(counts: tuple[int, ...]) -> Sizing:
        split = replace(request.split, mode="layer", ratios=tuple(float(c) for c in counts))
        return size(replace(request, split=split))

    if devices == 2:
        candidates: list[tuple[int, ...]] = [(first, units - first) for first in range(units + 1)]
    else:
        candidates = [_greedy(units, devices, lambda counts: sized(counts).devices)]
    best, best_margin = None, None
    for counts in candidates:
        margin = sized(counts).margin_bytes
        if margin >= 0 and (best_margin is None or margin > best_margin):
            best, best_margin = counts, margin
    return best


def _greedy(units: int, n_devices: int,
            devices_of: Callable[[tuple[int, ...]], tuple[DeviceSizing, ...]]) -> tuple[int, ...]:
    """Give each device in turn the most units it holds (the later ones taking the rest), checking that device only."""
    counts = [0] * n_devices
    left = units
    for position in range(n_devices - 1):
        take = 0
        for trial in range(left, -1, -1):
            counts[position], counts[position + 1] = trial, left - trial
            if devices_of(tuple(counts))[position].margin_bytes >= 0:
                take = trial
                break
        counts[position], left = take, left - take
        counts[position + 1] = left
    return tuple(counts)
