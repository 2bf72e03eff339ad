"""Row-count-invariant RMS norm (and the L2 norm): x / sqrt(mean(x^2) + eps) * weight over each row.

On a GPU, torch's reductions are not row-count invariant: a reduction over the
last dimension picks its thread layout from the number of outputs as well as the
reduced width (PyTorch's aten/src/ATen/native/cuda/Reduce.cuh,
`ReduceConfig::set_block_dimension`: one row gets up to 512 threads along the
row, eight rows 64 each), so a row's sum of squares is added in another order at
another row count. Here one program reduces one row, over one BLOCK-wide tile
(the width rounded up to a power of two), with `tl.sum`'s fixed tree: a row's
bits depend on nothing but the row. The width and the weight's row count are the
only integers the kernel sees besides the row's own index; the row count is not
an argument at all.

`mean=False` is the L2 norm x / sqrt(sum(x^2) + eps) (qwen35's gated delta net)
and takes no weight. The torch reference is the same formula in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, mean: bool = True) -> torch.Tensor:
    """x [..., d] float32; weight None, [d], or [..., d] matching x's trailing dimensions -> x's shape, float32."""
    squares = x.pow(2)
    reduced = squares.mean(-1, keepdim=True) if mean else squares.sum(-1, keepdim=True)
    y = x * torch.rsqrt(reduced + eps)
    return y if weight is None else y * weight


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
