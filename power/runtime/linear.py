"""Weight matrices as the matmul runs them: packed once at load, in float32, bfloat16 or int8.

`pack(weight, dtype, rows)` turns a dequantised float32 matrix [out, in] into a
callable `x [n, in] float32 -> [n, out] float32`. `rows` is the shape the trunk
runs at most often (its verification capacity); it only guides the packed layout.

- **float32**: `F.linear`; for one-row shapes the matrix is stored transposed
  ([in, out]), which MKL streams ~1.8x faster for a single row.
- **bfloat16**: on the CPU the matrix is reordered once into oneDNN's blocked
  layout (`mkldnn._reorder_linear_weight`) so no call repacks it: the LM head of
  Gemma 3 270M costs 24 ms at 8 rows instead of 48 ms, one thread. Elsewhere
  (CUDA, a torch without oneDNN, or a CPU without oneDNN's bf16 support such
  as an AVX2-only one) it is a plain bf16 `F.linear`.
- **int8** (CPU): each output row is requantised to int8 with its own scale
  (max |w| / 127), and each activation row to two int8 levels, `x = s * (hi +
  lo / LOW_LEVEL)`, so activations keep ~15 bits. The products are integer
  (oneDNN's u8 x s8 GEMM, exact int32 sums), scaled afterwards. Measured on
  Gemma 3 270M (bench/bench_runtime.py --accuracy): logits deviate from the
  exactly dequantised weights about as much as llama.cpp's own CPU path does.
  A CPU without VNNI (AVX2 only, or AVX-512 without VNNI) adds u8 x s8 products
  in pairs into saturating int16, so there activations use 7 bits per level
  (u8 at most 127, PyTorch's `reduce_range`): the sums stay exact, with ~13
  bits per activation instead of ~15.

Every variant keeps a row's result independent of the other rows in the call:
no reduction crosses rows, and int8 scales are per row. The trunks' fixed shapes
do the rest, so greedy speculation stays bit-identical to plain decoding in every
dtype. int8 goes further: a row's result does not depend on how many rows the
call has either (`row_count_invariant`), so an int8 LM head runs on the real
rows alone instead of a padded block.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from power.runtime.errors import RuntimeInputError

INT8_MAX = 127  # weights: each row requantised to [-127, 127]
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.cache
def exact_int8_pairs() -> bool:
    """Whether this CPU sums u8 x s8 products straight into int32 (VNNI or AMX); read from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            flags = set(cpuinfo.read().split())
    except OSError:
        return False  # unknown: the reduced range is exact on every CPU
    return any(flag in flags for flag in VNNI_FLAGS)


# Activations: each level in [-ACTIVATION_MAX, ACTIVATION_MAX], sent to oneDNN as u8 around UINT8_ZERO.
ACTIVATION_MAX = 127 if exact_int8_pairs() else 63
UINT8_ZERO = ACTIVATION_MAX + 1  # oneDNN's int8 GEMM takes unsigned activations with a zero point
LOW_LEVEL = 2 * ACTIVATION_MAX  # the second level carries the residual at 1/LOW_LEVEL of the first's step


class Linear:
    """A packed weight: call it on float32 rows; `nbytes` is what one call reads from memory."""

    shape: tuple[int, int]  # [out, in]
    row_count_invariant = False  # True: a row's result is the same bits whatever the number of rows in the call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


class Float32Linear(Linear):
    def __init__(self, weight: torch.Tensor, rows: int) -> None:
        self.shape = _matrix_shape(weight)
        self._transposed = rows == 1
        self._weight = weight.t().contiguous() if self._transposed else weight  # [in, out] or [out, in]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self._weight if self._transposed else F.linear(x, self._weight)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * 4


class BFloat16Linear(Linear):
    def __init__(self, weight: torch.Tensor, rows: int) -> None:
        self.shape = _matrix_shape(weight)
        weight = weight.to(torch.bfloat16)
        self._packed = _onednn_cpu(weight) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows) if self._packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if self._packed:
            return torch.ops.mkldnn._linear_pointwise(x, self._weight, None, "none", [], "").to(torch.float32)
        return F.linear(x, self._weight).to(torch.float32)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * 2


class Int8Linear(Linear):
    row_count_invariant = True  # integer sums are exact in any order; every scale is per row or per output

    def __init__(self, weight: torch.Tensor, rows: int, levels: int = 2) -> None:
        if not _onednn_cpu(weight):
            raise RuntimeInputError(f"int8 weights run on the CPU through oneDNN; this one is on {weight.device} "
                                    f"(oneDNN available: {torch.backends.mkldnn.is_available()})", code="PWR601",
                                    hint="use dtype bfloat16 (or float32) there instead")
        self.shape = _matrix_shape(weight)
        self._scale = (weight.abs().amax(dim=1) / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)  # [out]
        self._quantised = torch.round(weight / self._scale[:, None]).to(torch.int8)  # [out, in]
        self._levels = levels
        self._weight = torch.ops.onednn.qlinear_prepack(self._quantised, [levels * rows, self.shape[1]])
        self._zero_points = torch.zeros(self.shape[0], dtype=torch.long)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, self._weight, self._scale, self._zero_points)

    def select(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> [n, len(rows)]: the columns `rows` of self(x), bit for bit (one activation level).

        The integer sums of levels x weights are formed by a float GEMM whose every partial sum is an integer
        below 2^24 in magnitude (float32) or 2^53 (float64), so exact in any order; then the same two float32
        roundings as the full product: times the row's scale (oneDNN's output), times the step.
        `tests/test_greedy_head.py` checks the bits against the full product on Gemma's whole head.
        """
        if self._levels != 1:
            raise NotImplementedError("select is offered at one activation level (an LM head's)")
        step, units = self._activation(x)
        exact_in_float32 = ACTIVATION_MAX * INT8_MAX * self.shape[1] < 2**24
        dtype = torch.float32 if exact_in_float32 else torch.float64
        sums = torch.round(units).to(dtype) @ self._quantised[rows].to(dtype).t()
        return (sums.to(torch.float32) * self._scale[rows]).mul_(step)

    @property
    def rounding(self) -> float:
        """c with |self(x)[:, v] - effective_input(x) . w_v| <= c ||effective_input(x)|| ||w_v|| (one level).

        At one level an entry is the exact int32 sum of levels x weights, converted to float32, times the row's
        scale, times the activation step: at most 3 float32 roundings (the conversion is exact below 2^24); 5 are
        counted for oneDNN's unstated order of the unit source scale and zero destination shift. |x~ . w_v| <=
        ||x~|| ||w_v|| by Cauchy-Schwarz.
        """
        if self._levels != 1:
            raise NotImplementedError("a bound for two activation levels is not derived; the LM head runs at one")
        return 5 * 2.0**-24 / (1 - 5 * 2.0**-24)

    def effective_input(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> float64 [n, in]: the one-level activation the products use, step * round(x / step)."""
        if self._levels != 1:
            raise NotImplementedError("the effective input of two activation levels is not offered")
        step, units = self._activation(x)
        return torch.round(units).double() * step.double()

    def dequantised(self, begin: int, end: int) -> torch.Tensor:
        """Weight rows [begin, end) as float64: each int8 level times its row's float32 scale (exact in float64)."""
        return self._quantised[begin:end].double() * self._scale[begin:end, None].double()

    def _activation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in] -> (step [n, 1], x / step [n, in]), float32: the first level is round(x / step)."""
        step = (x.abs().amax(dim=1, keepdim=True) / ACTIVATION_MAX).clamp_min(torch.finfo(torch.float32).tiny)  # [n, 1]
        return step, x / step

    def _product(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 zero_points: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        step, units = self._activation(x)
        high = torch.round(units)
        if self._levels == 1:
            return self._sums(high, weight, scale, zero_points).mul_(step)
        low = torch.round((units - high) * LOW_LEVEL)
        sums = self._sums(torch.cat((high, low)), weight, scale, zero_points)  # [2n, out]
        return sums[:n].add_(sums[n:].div_(LOW_LEVEL)).mul_(step)  # [n, out]

    @staticmethod
    def _sums(levels: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
              zero_points: torch.Tensor) -> torch.Tensor:
        """Integer rows [m, in] in [-ACTIVATION_MAX, ACTIVATION_MAX] -> exact integer products [m, out], times the
        weight rows' scales."""
        unsigned = levels.add(UINT8_ZERO).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(unsigned, 1.0, UINT8_ZERO, weight, scale,
                                                  zero_points, None, 1.0, 0, torch.float32, "none", [], "")

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] + self.shape[0] * 4


KINDS: dict[str, Callable[[torch.Tensor, int], Linear]] = {"float32": Float32Linear, "bfloat16": BFloat16Linear, "int8": Int8Linear}


def pack(weight: torch.Tensor, dtype: str, rows: int) -> Linear:
    """weight [out, in] float32 -> a `Linear` in `dtype` (a key of KINDS), laid out for calls of about `rows` rows."""
    return KINDS[dtype](weight, rows)


def pack_head(weight: torch.Tensor, dtype: str, rows: int) -> Linear:
    """An LM head [vocab, d]: as `pack`, except that an int8 head quantises its activations at one level.

    The head reads the normed final residual, and one level keeps its logits as close to the exactly
    dequantised weights as llama.cpp's own are (docs/runtime.md), at half the rows of two levels.
    """
    return Int8Linear(weight, rows, levels=1) if dtype == "int8" else pack(weight, dtype, rows)


def _matrix_shape(weight: torch.Tensor) -> tuple[int, int]:
    out_features, in_features = weight.shape
    return out_features, in_features


def _onednn_cpu(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
