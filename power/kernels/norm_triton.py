"""The row-count-invariant RMS / L2 norm in Triton (`power.kernels.norm` says what it computes and why a row's
bits ignore its neighbours); imported only when a kernel runs on Triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, width, weight_rows, divisor, eps, HAS_WEIGHT: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=inside, other=0.0)
    reduced = tl.div_rn(tl.sum(x * x, axis=0), divisor)
    y = x * tl.div_rn(1.0, tl.sqrt_rn(reduced + eps))
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + (row % weight_rows) * width + cols, mask=inside, other=0.0)
    tl.store(y_ptr + row * width + cols, y, mask=inside)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float, mean: bool = True) -> torch.Tensor:
    """Same contract as `rms_norm_reference` (x and weight contiguous)."""
    width = x.shape[-1]
    y = torch.empty_like(x)
    rows = x.numel() // width
    weight_rows = 1 if weight is None else weight.numel() // width
    _rms_norm_kernel[(rows,)](x, x if weight is None else weight, y, width, weight_rows, float(width if mean else 1),
                              float(eps), HAS_WEIGHT=weight is not None, BLOCK=triton.next_power_of_2(width))
    return y
