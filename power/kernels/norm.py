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


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, mean: bool = True) -> torch.Tensor:
    """x [..., d] float32; weight None, [d], or [..., d] matching x's trailing dimensions -> x's shape, float32."""
    squares = x.pow(2)
    reduced = squares.mean(-1, keepdim=True) if mean else squares.sum(-1, keepdim=True)
    y = x * torch.rsqrt(reduced + eps)
    return y if weight is None else y * weight
