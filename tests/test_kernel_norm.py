"""Row-count-invariant RMS and L2 norms: a row's bits ignore the rows beside it; both paths close to float64."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import on_both_paths

from power.kernels import dispatch

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy

U = 2.0**-24


def exact(x: torch.Tensor, weight: torch.Tensor | None, eps: float, mean: bool) -> torch.Tensor:
    squares = x.double().pow(2)
    reduced = squares.mean(-1, keepdim=True) if mean else squares.sum(-1, keepdim=True)
    y = x.double() / torch.sqrt(reduced + eps)
    return y if weight is None else y * weight.double()


@pytest.mark.parametrize(("width", "heads", "mean"), [(40, 0, True), (16, 3, True), (24, 2, False)])
def test_a_rows_norm_is_the_same_bits_at_every_row_count(monkeypatch, width, heads, mean):
    """Model-width rows with a [d] weight, per-head rows with a weight per head, and the weightless L2 norm."""
    generator = torch.Generator().manual_seed(width)
    shape = (17, heads, width) if heads else (17, width)
    x = torch.randn(shape, generator=generator) * 3
    weight = None if not mean else torch.randn(shape[1:], generator=generator)
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)
        full = dispatch.rms_norm(x, weight, 1e-6, mean=mean)
        for rows in range(1, 18):
            assert torch.equal(dispatch.rms_norm(x[:rows].contiguous(), weight, 1e-6, mean=mean), full[:rows]), rows
        assert torch.equal(dispatch.rms_norm(x[9:10].contiguous(), weight, 1e-6, mean=mean), full[9:10])


@pytest.mark.parametrize(("width", "mean"), [(640, True), (256, True), (16, False)])
def test_both_paths_are_within_a_few_roundings_of_float64(monkeypatch, width, mean):
    """Sum of squares: gamma_d relative (all terms positive); the mean's division, eps, sqrt, the reciprocal and two
    products: one rounding each. So |y - y_exact| <= (gamma_d / 2 + 6 u) |y_exact| to first order; tested at 2x."""
    generator = torch.Generator().manual_seed(width)
    x = torch.randn(5, width, generator=generator)
    weight = torch.randn(width, generator=generator) if mean else None
    reference = exact(x, weight, 1e-6, mean)
    tolerance = 2 * (width * U / (1 - width * U) / 2 + 6 * U) * reference.abs()
    for y in on_both_paths(monkeypatch, lambda: dispatch.rms_norm(x, weight, 1e-6, mean=mean)):
        assert bool(((y.double() - reference).abs() <= tolerance).all())
