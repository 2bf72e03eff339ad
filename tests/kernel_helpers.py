"""Helpers for the kernel tests: both dispatch paths for one call, and random GGUF blocks.

Importing `power.kernels` on a machine without CUDA selects Triton's CPU
interpreter, so the Triton path runs here too (scripts/test also exports
TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from power.kernels.blocks import random_blocks

__all__ = ["ints", "on_both_paths", "random_blocks"]


def on_both_paths(monkeypatch: pytest.MonkeyPatch, call: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """(call(*args) with POWER_KERNELS=triton, call(*args) with POWER_KERNELS=reference)."""
    results = []
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)
        results.append(call(*args))
    monkeypatch.delenv("POWER_KERNELS")
    return results[0], results[1]


def ints(pair: tuple[Any, ...]) -> list[int]:
    """0-d tensors -> Python ints, for comparing (accepted, next token) results."""
    return [int(value) for value in pair]
