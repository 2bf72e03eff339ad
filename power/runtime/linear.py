"""Weight matrices as the products run them: quantised (row-count invariant) or the float32 reference.

A `Linear` is a callable `x [n, in] float32 -> [n, out] float32` in one of the
plan's arithmetics (`power.documents.arithmetic`):

- **quantised** on the CPU (`QuantLinear`): the GGUF matrix kept in its own
  blocks (reordered once into `power.kernels.cpu`'s tile layout, the same size),
  multiplied as llama.cpp's CPU path multiplies it: each activation block
  quantised to int8, integer dot products with exact int32 sums, one float
  rounding per block in a fixed order. `path` is the instruction path the
  kernels chose at load (amx, avx512vnni, avxvnni, avx2 or scalar;
  `POWER_CPU_PATH` forces one), and every path computes the same bits.
- **quantised** on the GPU path (`BlockLinear`): the GGUF rows as they are in the file,
  multiplied by the batch-invariant Triton kernel (`power.kernels.qmatmul`: one
  tile configuration and one reduction order whatever the row count).
- **float32** (`Float32Linear`): the exactly dequantised weights, `F.linear`;
  for one-row shapes the matrix is stored transposed ([in, out]), which MKL
  streams ~1.8x faster for a single row. A float GEMM does not promise a row the
  same bits at another row count, so the trunks pad every float32 forward to
  their fixed shape.

Every packing keeps a row's result independent of the other rows in the call.
The quantised ones go further: a row's result does not depend on how many rows
the call has either (`row_count_invariant`, tested at every row count), which is
what lets a forward run on its real rows only. `nbytes` is what a packing holds.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from power.kernels import dispatch
from power.kernels.cpu import QuantMatrix
from power.kernels.cpu.greedy import CompactHead
from power.kernels.cpu.layout import KINDS as CPU_KINDS
from power.kernels.qmatmul import SUPPORTED as BLOCK_TYPES
from power.kernels.qmatmul import step_size

CPU_TYPES = tuple(CPU_KINDS)  # the GGML types the CPU kernels multiply in place

class Linear:
    """A packed weight: call it on float32 rows; `nbytes` is what it holds (and one call reads) in memory."""

    shape: tuple[int, int]  # [out, in]
    row_count_invariant = False  # True: a row's result is the same bits whatever the number of rows in the call
    path = ""  # the instruction path the products take

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """rows int64 [k] -> float32 [k, in]: those output rows' weights, exactly dequantised (a tied embedding)."""
        raise NotImplementedError(f"{type(self).__name__} does not read its rows back")

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


class Float32Linear(Linear):
    path = "torch-float32"

    def __init__(self, weight: torch.Tensor, rows: int) -> None:
        self.shape = _matrix_shape(weight)
        self._transposed = rows == 1
        self._weight = weight.t().contiguous() if self._transposed else weight  # [in, out] or [out, in]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self._weight if self._transposed else F.linear(x, self._weight)

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self._weight[:, rows].t().contiguous() if self._transposed else self._weight[rows]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * 4


class QuantLinear(Linear):
    """A GGUF matrix multiplied in its blocks on the CPU: a `power.kernels.cpu.QuantMatrix`, or a Q8_0 LM head held
    once for the exact greedy head (`power.kernels.cpu.greedy.CompactHead`, the same bits); `matrix` is what it
    multiplies by."""

    row_count_invariant = True  # exact integer sums, one fixed float order per (row, output)

    def __init__(self, matrix: QuantMatrix | CompactHead) -> None:
        self.shape, self.path, self._matrix = matrix.shape, matrix.path, matrix

    @property
    def matrix(self) -> QuantMatrix | CompactHead:
        return self._matrix

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._matrix(x)

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self._matrix.rows(rows)

    @property
    def nbytes(self) -> int:
        return self._matrix.nbytes


class BlockLinear(Linear):
    """GGUF rows [out, row_bytes] uint8 as they lie in the file, multiplied by `power.kernels.dispatch.qmatmul`
    (Triton on a GPU, its reference elsewhere)."""

    row_count_invariant = True  # one tile configuration and one reduction order whatever the row count

    def __init__(self, rows: torch.Tensor, qtype: str, shape: tuple[int, int]) -> None:
        self.shape, self.qtype, self._rows = shape, qtype, rows
        self.path = f"triton-qmatmul-{qtype}" if rows.device.type == "cuda" else f"reference-qmatmul-{qtype}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.qmatmul(x, self._rows, self.qtype)

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        picked = self._rows[rows]
        return dispatch.dequantize(self.qtype, picked.reshape(-1), (picked.shape[0], self.shape[1]))

    @property
    def nbytes(self) -> int:
        return self._rows.numel()


class Stacked(Linear):
    """Several matrices that read the same input, their outputs side by side (one product each)."""

    def __init__(self, parts: Sequence[Linear]) -> None:
        self._parts = tuple(parts)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        self.row_count_invariant = all(p.row_count_invariant for p in parts)
        self.path = "+".join(dict.fromkeys(p.path for p in parts))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self._parts], dim=-1)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._parts)


def kernel_products(linear: object) -> list[QuantMatrix] | None:
    """The CPU kernels' products a matrix multiplies by, their outputs side by side in this order; None when any part
    of it is another product (a kernel that runs the products itself takes only these: `power.kernels.cpu.layer`)."""
    if isinstance(linear, QuantLinear):
        return [linear.matrix] if isinstance(linear.matrix, QuantMatrix) else None
    if isinstance(linear, Stacked):
        parts = [kernel_products(part) for part in linear._parts]
        return None if None in parts else [m for part in parts if part for m in part]
    return None


def quantised(raw: torch.Tensor, qtype: str, shape: tuple[int, int], device: str,
              kernels: bool = False) -> Linear | None:
    """A GGUF matrix's bytes (flat uint8) in the quantised arithmetic on `device`: the CPU's kernels, or with `kernels`
    (the GPU path) the Triton product; None for a type that product does not read."""
    if not kernels:
        return QuantLinear(QuantMatrix(qtype, raw, shape)) if qtype in CPU_TYPES else None
    if qtype not in BLOCK_TYPES or shape[1] % step_size(qtype):
        return None
    return BlockLinear(raw.to(device).view(shape[0], -1), qtype, shape)


def _matrix_shape(weight: torch.Tensor) -> tuple[int, int]:
    out_features, in_features = weight.shape
    return out_features, in_features
