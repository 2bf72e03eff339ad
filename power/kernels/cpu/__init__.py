"""Row-count-invariant products with GGUF matrices kept in their blocks, on the CPU.

API
---
- `QuantMatrix(qtype, raw, shape, path=None)`: a GGUF matrix of type `qtype` ("Q8_0", "Q5_0", "Q4_0", "Q4_K",
  "Q5_K", "Q6_K", "F16", "BF16", "F32"), `raw` its flat uint8 bytes as stored in the file, `shape` (out, in).
  The bytes are reordered once into the tile layout (`power.kernels.cpu.layout`, the same size); no float copy.
  - `m(x)`: x float32 [n, in] -> float32 [n, out].
  - `m.select(x, rows)`: rows int64 [k] -> float32 [n, k], bit-identical to `m(x)[:, rows]`.
  - `m.rows(rows)`: rows int64 [k] -> float32 [k, in], those output rows dequantised from the tile layout, bit-identical
    to `power.kernels.dequant.dequantize_reference` of the file's rows (a tied embedding reads its LM head this way).
  - `m.nbytes` (the bytes held), `m.shape`, `m.qtype`, `m.path` (the instruction path that runs),
    `m.row_count_invariant` (always True), `m.tiles` (the tile layout, flat uint8: read it, never write it; the
    greedy head's cheap pass reads its exact blocks there, `power.kernels.cpu.greedy`), `m.operands` (the op's
    arguments for the whole product, for a kernel that multiplies by it itself: `power.kernels.cpu.layer`).
- `available_paths()`, `chosen_path()`, `CPUPathError`, `PATH_NAMES` (`power.kernels.cpu.build`); the env var
  `POWER_CPU_PATH` = amx | avx512vnni | avxvnni | avx2 | scalar forces a path, and one this CPU lacks (amx: or
  that Linux does not let this process use) is refused with the reason.
- `reference_matmul(qtype, raw, shape, x)`: the same arithmetic in plain torch (`power.kernels.cpu.reference`).

Arithmetic (every path and the reference compute exactly this, bit for bit)
-------------------------------------------------------------------------
Quantised matrices (as llama.cpp's CPU path multiplies them, with float32 activation scales):
1. Each activation row is cut into blocks of 32 (Q8_0, Q5_0, Q4_0) or 256 (Q4_K, Q5_K, Q6_K) values. For a
   block, `d = max|x| / 127` and `q = round_half_even(x * (1 / d))` clamped to [-127, 127] (q = 0 when d = 0),
   all in float32; the int sums of q over each 16 values are kept too.
2. For each (row, output) and block b, an integer `s_b` that is exact (int32, no overflow is possible):
   - Q8_0, Q4_0, Q5_0: `s = sum_k w_k q_k` with the block's integer weights (Q4_0: nibble - 8, Q5_0: 5 bits - 16);
     float term `t_b = (d_w * d_x) * float(s)`.
   - Q4_K, Q5_K: `s = sum_j sc_j * sum_{k in j} u_k q_k` and `m = sum_j mn_j * sum_{k in j} q_k` over the 8
     sub-blocks j of 32 (u the unsigned 4- or 5-bit weights, sc/mn their 6-bit scales and mins);
     `t_b = (d_x * d) * float(s) - (d_x * dmin) * float(m)`.
   - Q6_K: `s = sum_j sc_j * sum_{k in j} (u_k - 32) q_k` over the 16 sub-blocks of 16 (sc_j int8);
     `t_b = (d_x * d) * float(s)`.
   float(s) rounds to nearest even; every product and difference is one float32 rounding (no FMA).
3. The result is `((0 + t_0) + t_1) + ...` in block order.
F32, F16 and BF16 matrices: the weights widen exactly to float32 and the result is
`((0 + w_0 x_0) + w_1 x_1) + ...` in the order of the input features, one rounding per product and per sum.

Nothing in these steps looks at another row, and the order is fixed per (row, output), so a row's result is
the same bits whatever the number of rows in the call, and whichever path computes it. The kernels
(csrc/qmatmul.cpp) parallelise over tiles of 16 output rows on Power's kernel threads (csrc/pool.cpp, as many as
torch's intra-op threads), never over the sum, quantise the activations once per call, and read each weight
block once for up to 16 rows.

The amx path (csrc/amx.h) is the avx512vnni build plus AMX int8 tile products for the integer sums of step 2,
taken for a call of at least 3 (Q8_0), 5 (Q4_0, Q5_0, Q6_K) or 8 (Q4_K, Q5_K) rows that reads at least
1.5 MiB of weights times rows; smaller calls run the avx512vnni code, which is as fast or faster there. A tile
product multiplies up to 16 activation rows by the weights of a tile's 16 output rows, whose 4-byte groups are
already the tile's B layout, into exact int32 sums, so the float steps are unchanged:
- Q8_0, Q4_0, Q5_0: one product per block of 32 (K = 32; Q4_0/Q5_0 decoded to signed bytes first), its sums
  stored and taken through step 2's float term row by row.
- Q4_K, Q5_K, Q6_K: each weight times its sub-block's scale, P = sc_j * u (Q6_K: sc_j * (u - 32)), is an int16
  at most 128 * 63 in size; split into bytes P = 256 * high + low, a block's s = sum_k q_k P_k is two
  products over all 256 weights, s = sum q * low + 256 * sum q * high (the same integer; Q4_K/Q5_K's m stays a
  vector dot product of the mins with the activation sums).
Linux lets a process use tile data only after it asked (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
asked when the paths are listed); if it refuses, amx is not available and a forced amx says why.
Measured (an Intel Xeon with AMX, one thread, per call, amx over avx512vnni): the 262,144 x 640 Q8_0 head
1.24x at 4 rows, 1.41x at 8, 1.54-1.58x at 16-32; 640 x 2048 Q6_K 1.40x at 8, 2.1x at 16-32; 640 x 2048
Q4_K 1.12x at 8, 1.54x at 16-32; 2048 x 640 Q5_0 1.33x at 8, 1.63-1.66x at 16-32; the same at 1-2 rows
(docs/kernels.md).
"""

from __future__ import annotations

import torch

from power.kernels.cpu.build import PATH_NAMES, CPUPathError, available_paths, chosen_path, extension
from power.kernels.cpu.layout import KINDS, TILE, lane_bytes, tile_matrix
from power.kernels.cpu.reference import matmul as reference_matmul
from power.kernels.dequant import BLOCK_LAYOUT

__all__ = ["PATH_NAMES", "CPUPathError", "QuantMatrix", "available_paths", "chosen_path", "reference_matmul"]


class QuantMatrix:
    """A GGUF matrix [out, in] in the tile layout; call it on float32 rows."""

    row_count_invariant = True

    def __init__(self, qtype: str, raw: torch.Tensor, shape: tuple[int, int], path: str | None = None) -> None:
        if qtype not in KINDS:
            raise ValueError(f"QuantMatrix: GGML type {qtype} has no CPU kernel (supported: {', '.join(KINDS)})")
        out_features, in_features = shape
        block, type_size = BLOCK_LAYOUT[qtype]
        if in_features % block:
            raise ValueError(f"QuantMatrix: a {qtype} row of {in_features} values is not whole blocks of {block}")
        expected = out_features * in_features // block * type_size
        if raw.device.type != "cpu":
            raise ValueError(f"QuantMatrix: the CPU kernels need the bytes on the CPU, got them on {raw.device}")
        if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != expected:
            raise ValueError(f"QuantMatrix: raw must be flat uint8 of {expected} bytes for {qtype} {tuple(shape)}, "
                             f"got {raw.dtype} {tuple(raw.shape)}")
        self.qtype = qtype
        self.shape = (out_features, in_features)
        self.path = chosen_path(path)
        self._ops = extension(self.path)
        self._matmul = self._ops.matmul.default  # the op's one overload, called without the packet's lookup
        self._kind = KINDS[qtype]
        self._tiles = tile_matrix(qtype, raw, self.shape)
        self._every_tile = torch.arange(-(-out_features // TILE), dtype=torch.int64)

    @property
    def nbytes(self) -> int:
        return self._tiles.numel()

    @property
    def tiles(self) -> torch.Tensor:
        return self._tiles

    @property
    def operands(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """What the op `matmul` takes for the whole product: the kind, the tile layout and every tile's index (a
        kernel that multiplies by this matrix itself, `power.kernels.cpu.layer`)."""
        return self._kind, self._tiles, self._every_tile

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] float32 -> [n, out] float32."""
        y = self._run(x, self._every_tile)
        return y if y.shape[1] == self.shape[0] else y[:, :self.shape[0]].contiguous()

    def select(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x [n, in], rows int64 [k] -> [n, k]: the same bits as `self(x)[:, rows]`, computing only their tiles."""
        rows = rows.to(torch.int64)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.shape[0]):
            raise IndexError(f"QuantMatrix.select: rows must lie in [0, {self.shape[0]})")
        tiles = torch.unique(rows // TILE)
        y = self._run(x, tiles)
        return y[:, torch.searchsorted(tiles, rows // TILE) * TILE + rows % TILE]

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """rows int64 [k] -> float32 [k, in]: those output rows' weights, exactly as the dequantiser gives them."""
        rows = rows.to(torch.int64).contiguous()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.shape[0]):
            raise IndexError(f"QuantMatrix.rows: rows must lie in [0, {self.shape[0]})")
        return self._ops.rows(self._kind, self._tiles, self.shape[1], rows.reshape(-1), lane_bytes(self.qtype))

    def _run(self, x: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"QuantMatrix: x must be [n, {self.shape[1]}], got {tuple(x.shape)}")
        if x.dtype != torch.float32 or not x.is_contiguous():  # a decode step's rows already are: no two torch calls
            x = x.to(torch.float32).contiguous()
        return self._matmul(self._kind, self._tiles, self.shape[1], x, tiles)
