"""Weight matrices as the products run them: quantised (row-count invariant) or the float32 reference.

`pack(weight, arithmetic, rows)` turns a matrix [out, in] into a callable
`x [n, in] float32 -> [n, out] float32` in one of the plan's arithmetics
(`power.documents.arithmetic`):

- **quantised** on the CPU (`Int8Linear`): each output row is held as int8 with
  its own scale (max |w| / 127), and each activation row is quantised to two
  int8 levels, `x = s * (hi + lo / LOW_LEVEL)`, so activations keep ~15 bits.
  The products are integer (oneDNN's u8 x s8 GEMM, exact int32 sums), scaled
  afterwards. Measured on Gemma 3 270M (bench/bench_runtime.py --accuracy):
  logits deviate from the exactly dequantised weights about as much as
  llama.cpp's own CPU path does. A CPU without VNNI (AVX2 only, or AVX-512
  without VNNI) adds u8 x s8 products in pairs into saturating int16, so there
  activations use 7 bits per level (u8 at most 127, PyTorch's `reduce_range`):
  the sums stay exact, with ~13 bits per activation instead of ~15.
- **quantised** on a GPU (`BlockLinear`): the GGUF rows as they are in the file,
  multiplied by the batch-invariant Triton kernel (`power.kernels.qmatmul`: one
  tile configuration and one reduction order whatever the row count).
- **float32** (`Float32Linear`): the exactly dequantised weights, `F.linear`;
  for one-row shapes the matrix is stored transposed ([in, out]), which MKL
  streams ~1.8x faster for a single row. A float GEMM does not promise a row the
  same bits at another row count, so the trunks pad every float32 forward to
  their fixed shape.

Every packing keeps a row's result independent of the other rows in the call:
no reduction crosses rows, and every scale is per row or per output. The
quantised packings go further: a row's result does not depend on how many rows
the call has either (`row_count_invariant`, tested at every row count), which is
what lets a forward run on its real rows only. `path` names the instruction path
a packing runs (the receipt and the bench output report it).
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

from power.documents.arithmetic import QUANTISED
from power.kernels import dispatch
from power.runtime.errors import RuntimeInputError

INT8_MAX = 127  # weights: each row requantised to [-127, 127]
VNNI_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")  # best first


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            return frozenset(cpuinfo.read().split())
    except OSError:
        return frozenset()


def exact_int8_pairs() -> bool:
    """Whether this CPU sums u8 x s8 products straight into int32 (VNNI or AMX)."""
    return any(flag in cpu_flags() for flag in VNNI_FLAGS)


def int8_path() -> str:
    """The instruction path oneDNN's u8 x s8 products take here: the best int8 dot-product flag, or the 7-bit
    activations of a CPU without one."""
    best = next((flag for flag in VNNI_FLAGS if flag in cpu_flags()), None)
    return f"onednn-u8s8-{best}" if best else "onednn-u8s8-7bit"


# Activations: each level in [-ACTIVATION_MAX, ACTIVATION_MAX], sent to oneDNN as u8 around UINT8_ZERO.
ACTIVATION_MAX = 127 if exact_int8_pairs() else 63
UINT8_ZERO = ACTIVATION_MAX + 1  # oneDNN's int8 GEMM takes unsigned activations with a zero point
LOW_LEVEL = 2 * ACTIVATION_MAX  # the second level carries the residual at 1/LOW_LEVEL of the first's step


class Linear:
    """A packed weight: call it on float32 rows; `nbytes` is what it holds (and one call reads) in memory."""

    shape: tuple[int, int]  # [out, in]
    row_count_invariant = False  # True: a row's result is the same bits whatever the number of rows in the call
    path = ""  # the instruction path the products take

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

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

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * 4


class Int8Linear(Linear):
    row_count_invariant = True  # integer sums are exact in any order; every scale is per row or per output

    def __init__(self, weight: torch.Tensor, rows: int, levels: int = 2) -> None:
        if not _onednn_cpu(weight):
            raise RuntimeInputError(f"int8 weights run on the CPU through oneDNN; this one is on {weight.device} "
                                    f"(oneDNN available: {torch.backends.mkldnn.is_available()})", code="PWR601")
        self.shape = _matrix_shape(weight)
        self.path = int8_path()
        self._scale = (weight.abs().amax(dim=1) / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)  # [out]
        quantised = torch.round(weight / self._scale[:, None]).to(torch.int8)  # [out, in]
        self._levels = levels
        self._weight = torch.ops.onednn.qlinear_prepack(quantised, [levels * rows, self.shape[1]])
        self._zero_points = torch.zeros(self.shape[0], dtype=torch.long)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        step = (x.abs().amax(dim=1, keepdim=True) / ACTIVATION_MAX).clamp_min(torch.finfo(torch.float32).tiny)  # [n, 1]
        units = x / step
        high = torch.round(units)
        if self._levels == 1:
            return self._sums(high).mul_(step)
        low = torch.round((units - high) * LOW_LEVEL)
        sums = self._sums(torch.cat((high, low)))  # [2n, out]
        return sums[:n].add_(sums[n:].div_(LOW_LEVEL)).mul_(step)  # [n, out]

    def _sums(self, levels: torch.Tensor) -> torch.Tensor:
        """Integer rows [m, in] in [-ACTIVATION_MAX, ACTIVATION_MAX] -> exact integer products [m, out], times the
        weight rows' scales."""
        unsigned = levels.add(UINT8_ZERO).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(unsigned, 1.0, UINT8_ZERO, self._weight, self._scale,
                                                  self._zero_points, None, 1.0, 0, torch.float32, "none", [], "")

    @property
    def nbytes(self) -> int:
        return int8_bytes(*self.shape)


def int8_bytes(out_features: int, in_features: int) -> int:
    """What an `Int8Linear` holds: a byte a weight and a float32 scale per output row."""
    return out_features * in_features + out_features * 4


class BlockLinear(Linear):
    """GGUF rows [out, row_bytes] uint8 as they lie in the file, multiplied by `power.kernels.dispatch.qmatmul`
    (Triton on a GPU, its reference elsewhere)."""

    row_count_invariant = True  # one tile configuration and one reduction order whatever the row count

    def __init__(self, rows: torch.Tensor, qtype: str, shape: tuple[int, int]) -> None:
        self.shape, self.qtype, self._rows = shape, qtype, rows
        self.path = f"triton-qmatmul-{qtype}" if rows.device.type == "cuda" else f"reference-qmatmul-{qtype}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.qmatmul(x, self._rows, self.qtype)

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


def pack(weight: torch.Tensor, arithmetic: str, rows: int) -> Linear:
    """A dequantised matrix [out, in] float32 -> a `Linear` in `arithmetic`, laid out for calls of about `rows`
    rows (the quantised CPU packing: requantised per output row)."""
    return Int8Linear(weight, rows) if arithmetic == QUANTISED else Float32Linear(weight, rows)


def pack_head(weight: torch.Tensor, arithmetic: str, rows: int) -> Linear:
    """An LM head [vocab, d]: as `pack`, except that a quantised head quantises its activations at one level.

    The head reads the normed final residual, and one level keeps its logits as close to the exactly
    dequantised weights as llama.cpp's own are (docs/runtime.md), at half the rows of two levels.
    """
    return Int8Linear(weight, rows, levels=1) if arithmetic == QUANTISED else Float32Linear(weight, rows)


def _matrix_shape(weight: torch.Tensor) -> tuple[int, int]:
    out_features, in_features = weight.shape
    return out_features, in_features


def _onednn_cpu(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
