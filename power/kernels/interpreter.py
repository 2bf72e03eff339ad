"""Triton's CPU interpreter, made to keep the one property our kernels rely on: a row's result ignores its neighbours.

Under TRITON_INTERPRET=1 `tl.dot` is numpy's `matmul`, which hands float32
tiles to the BLAS. On some CPUs (measured: an AVX2-only one) OpenBLAS picks its
inner kernel by a row's position in the tile, so row 9 of a 16-row tile and the
same row alone in a padded tile differ in the last bit. On a GPU the kernel's
fixed tile computes every row the same way; `install` gives the interpreter the
same guarantee with numpy's own einsum loops (one summation order per output
element), which agree with `matmul` to float32 rounding.
"""

from __future__ import annotations

import numpy as np


def install() -> None:
    """Replace the interpreter's dot with a row-invariant one (idempotent)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "row_invariant", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.einsum("...mk,...kn->...mn", a.data, b.data, optimize=False).astype(d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    create_dot.row_invariant = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot
