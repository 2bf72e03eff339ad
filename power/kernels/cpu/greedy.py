"""A Q8_0 LM head held once for the exact greedy head: its cheap pass on the CPU, and its torch reference.

API (float32 activations on the CPU; `path` as for `QuantMatrix`, default the matrix's own)
-------------------------------------------------------------------------------------------
- `CompactHead(matrix, exact_blocks)`: from a Q8_0 `QuantMatrix` [vocab, in] (the op `greedy_hold`), one stream the
  pass reads from start to end: per 16-row tile, its blocks of 32 input channels in order,
  those of `exact_blocks` (block indices) as their Q8_0 bytes and the others as their weights' high nibbles, and
  beside it the low array: per tile, the bounded blocks' low nibbles, grouped as the high ones.
  Both together are the head, held once (`nbytes`: 34 bytes per row and exact block, 35 per bounded one: its Q8_0
  bytes and a norm byte), so the Q8_0 matrix it was built from can go:
  - `head(x)`: x [n, in] -> [n, vocab], the Q8_0 product bit for bit (op `compact_matmul`: a bounded block's Q8_0
    bytes are its nibbles recombined, q + 128 = 16 (h + 8) + (l + 8), multiplied as the product multiplies them);
  - `head.rows(rows)`: rows int64 [k] -> [k, in] dequantised as `QuantMatrix.rows` gives them (op `compact_rows`;
    a tied embedding reads its tokens there);
  - `head.bounded(x)`: x [n, in] -> (p, bound) float32 [n, vocab] with
    `fl(p - bound) <= matrix(x) <= fl(p + bound)` for every row and token (the float32 comparisons included).
    Every row multiplies the exact blocks by all 8 bits and the rest by their high nibbles; with every block
    exact, p is `matrix(x)` bit for bit.
  - `head.argmax(x)`: x [n, in] -> (argmax, tiles) int64 [n]: the whole exact greedy head in one kernel call
    (`power.runtime.greedy_head` states why it is exact): the pass, reduced per 16-row tile to its largest lower and
    upper bounds; the tiles whose largest upper bound reaches the row's best lower bound; the exact scores of their
    tokens read in full from the stream and the low array (`head(x)`'s bits), taken in increasing token ID with a
    strict comparison, so the lowest ID wins a tie as in `torch.argmax`. -1 for a row whose pass is not finite.
- `calibrated_blocks(x, count)`: the `count` blocks of largest mean activation norm over sample rows x, the
  blocks where exact weights narrow the bound most for rows like them (which blocks are exact never decides
  whether the bound holds).
- `reference_bounded(raw, shape, x, exact_blocks)`: the same arithmetic in plain torch from the GGUF bytes; every
  instruction path computes its bits (tests/test_kernel_cpu_greedy.py).

Arithmetic (csrc/greedyhead.cpp; no fused multiply-add)
-------------------------------------------------------
Row x is quantised as the products quantise it (`power.kernels.cpu`; csrc/quantize.h, the same code): per block b
of 32, levels x_q in [-127, 127] and a float32 scale d_x. Token v's block has a float16 scale d_w and int8 weights
q, split as q = 16 h + 8 + l with h = floor(q / 16) in [-8, 7] and l in [-8, 7]. With c_b = fl(d_w d_x), the full
product's own scale product, the block's integer is A_b = sum q x_q (an exact block: the full product's integer S_b) or
A_b = sum (16 h + 8) x_q = 16 sum (h + 8) x_q - 120 sum x_q (a bounded one), exact in int32 and in float32
(|A_b| < 2^24), and tau_b = fl(c_b A_b). In block order from +0:
p = sum tau_b, m = sum |tau_b|, r = sum over the bounded blocks of fl(fl(|c_b| L_b) X_b), where L_b =
ceil(4 ||l||) (stored, a byte) and X_b is ||x_q|| rounded up to float32; then
bound = fl(fl(fl(r k_rem) + fl(m k_sum)) + floor).

The bound. u = 2^-24, gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
Lemma 3.1; a sum of k terms in any fixed order: eq. 3.5), nb blocks, g = gamma_{nb+4}. The full product is
s = sum_b fl(c_b S_b) added in block order (`power.kernels.cpu`), so with U = sum c_b S_b and P = sum c_b A_b:
  |s - U| <= gamma_nb sum |c_b S_b|, |p - P| <= gamma_nb sum |c_b A_b| = gamma_nb mu     (one product, nb - 1 sums)
  |U - P| = |sum_bounded c_b sum l x_q| <= sum_bounded |c_b| ||l|| ||x_q|| = rho           (Cauchy-Schwarz)
  sum |c_b S_b| <= mu + rho, so |s - p| <= (1 + g) rho + 2 g mu.
The computed sums of nonnegative terms lose at most a factor (1 - g): rho <= r / (4 (1 - g)), mu <= m / (1 - g),
and |p| <= m (1 + g) / (1 - g). The caller's fl(p -+ bound) errs by at most u (|p| + bound), and bound itself is at
least (r k_rem + m k_sum)(1 - u)^3. Hence k_rem = (1 + g) / (4 (1 - g)^3) and k_sum = (2 g + 2 u) / (1 - g)^3, each
rounded up to float32, give bound >= |s - p| + u (|p| + bound). A subnormal c_b breaks the relative model by at
most 2^-149 an operation; `floor` = 2^-100 covers that for any realistic row. (The bound never depends on which
blocks are exact: that choice decides only how tight it is.)

The stream: per 16-row tile of `power.kernels.cpu.layout`, its blocks in order, each in one of two forms. An exact
block is its Q8_0 tile block as the products read it (544 bytes). A bounded block takes 304 bytes: the tile's 16
float16 scales (32 bytes, as in its Q8_0 block), the 16 L_b (bytes), then 4 groups of 64 bytes, group k holding
for each row (4 bytes) h + 8 of weights 4k..4k+3 in the low nibbles and of weights 16+4k..16+4k+3 in the high
nibbles. The pass reads one contiguous run per tile, which the hardware prefetcher follows: reading the exact
blocks from the Q8_0 tiles instead, as gaps in a second stream, made the pass 2.1x slower at 6 exact blocks of 20
(docs/runtime.md, "The exact greedy LM head").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from power.kernels.cpu import QuantMatrix
from power.kernels.cpu.build import chosen_path, extension
from power.kernels.cpu.reference import quantize_rows
from power.kernels.dequant import BLOCK_LAYOUT, _f16

BLOCK = 32
UNIT = 2.0**-24
FLOOR = 2.0**-100


def constants(in_features: int) -> tuple[float, float]:
    """(k_rem, k_sum) of the module docstring for rows of `in_features`, rounded up to float32."""
    blocks = in_features // BLOCK
    g = (blocks + 4) * UNIT / (1 - (blocks + 4) * UNIT)
    k_rem = (1 + g) / (4 * (1 - g) ** 3)
    k_sum = (2 * g + 2 * UNIT) / (1 - g) ** 3
    return _up(k_rem), _up(k_sum)


class CompactHead:
    """A Q8_0 head held once: the pass's stream of exact blocks and high nibbles with the norms of what they leave
    out, and the low array of those nibbles' low halves. `bounded` scores every row; `argmax` is the whole greedy
    head; the product, its rows and the refine read the same bytes in full (a bounded block's Q8_0 bytes are its
    high and low nibbles recombined), so the Q8_0 tiles it was built from need not be kept."""

    qtype = "Q8_0"
    row_count_invariant = True

    def __init__(self, matrix: QuantMatrix, exact_blocks: Sequence[int]) -> None:
        if matrix.qtype != "Q8_0":
            raise ValueError(f"CompactHead: a Q8_0 head is split into nibbles here, not {matrix.qtype}")
        self.shape, self.path = matrix.shape, matrix.path
        self.exact = _exact_marks(exact_blocks, matrix.shape[1] // BLOCK)
        self._stream, self._low = self._ops(None).greedy_hold(matrix.tiles, self.exact)
        self._constants = constants(matrix.shape[1])

    @property
    def nbytes(self) -> int:
        return self._stream.numel() + self._low.numel()

    @property
    def pass_nbytes(self) -> int:
        """The bytes the pass reads: the stream (the low array is read only for the candidates' tiles)."""
        return self._stream.numel()

    def __call__(self, x: torch.Tensor, path: str | None = None) -> torch.Tensor:
        """x [n, in] float32 -> [n, vocab]: the Q8_0 head's product, bit for bit."""
        return self._ops(path).compact_matmul(self._stream, self.exact, self._low, self._rows(x))[:, :self.shape[0]]

    def rows(self, rows: torch.Tensor, path: str | None = None) -> torch.Tensor:
        """rows int64 [k] -> float32 [k, in]: those output rows dequantised, as `QuantMatrix.rows` gives them."""
        rows = rows.to(torch.int64).reshape(-1).contiguous()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.shape[0]):
            raise IndexError(f"CompactHead.rows: rows must lie in [0, {self.shape[0]})")
        return self._ops(path).compact_rows(self._stream, self.exact, self._low, rows)

    def bounded(self, x: torch.Tensor, path: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in] float32 -> (p, bound) float32 [n, vocab] (the module docstring)."""
        p, bound = self._ops(path).greedy_pass(self._stream, self.exact, self._rows(x), *self._constants, FLOOR)
        return p[:, :self.shape[0]], bound[:, :self.shape[0]]

    def argmax(self, x: torch.Tensor, path: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in] float32 -> (argmax, tiles) int64 [n]: per row the argmax of the head's product (lowest token ID on
        ties) from the pass, the tiles holding a candidate (a token whose upper bound reaches the row's best lower
        bound) and their tokens' exact scores, or -1 where the row's pass is not finite; and how many tiles it
        refined."""
        return self._ops(path).greedy_argmax(self._stream, self.exact, self._low, self._rows(x),
                                             self.shape[0], *self._constants, FLOOR)

    def full_argmax(self, x: torch.Tensor, path: str | None = None) -> torch.Tensor:
        """x [n, in] float32 -> int64 [n]: per row the argmax of the head's product (lowest token ID on ties), reduced
        as each tile is computed, or -1 where a score is not finite."""
        return self._ops(path).compact_argmax(self._stream, self.exact, self._low, self._rows(x), self.shape[0])

    def _ops(self, path: str | None) -> Any:
        return extension(chosen_path(path) if path else self.path)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"CompactHead: x must be [n, {self.shape[1]}], got {tuple(x.shape)}")
        return x.to(torch.float32).contiguous()


def activations(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x [n, in] -> levels float64 [n, nb, 32], scales float32, sums int32 and norms (rounded up) float32 [n, nb]."""
    levels, scales = quantize_rows(x.to(torch.float32).contiguous(), BLOCK)
    return levels, scales, levels.sum(dim=2).to(torch.int32), _sqrt_up(levels.pow(2).sum(dim=2))


def calibrated_blocks(x: torch.Tensor, count: int) -> list[int]:
    """The `count` blocks of largest mean d_x * norm over the rows of x [n, in], in increasing order (ties to the
    lower block)."""
    _, scales, _, norms = activations(x)
    energy = (scales.double() * norms.double()).mean(dim=0)
    return sorted(torch.sort(energy, descending=True, stable=True).indices[:count].tolist())


def reference_bounded(raw: torch.Tensor, shape: tuple[int, int], x: torch.Tensor,
                      exact_blocks: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (p, bound) in plain torch from the head's GGUF Q8_0 bytes (flat uint8) of `shape` [vocab, in]."""
    vocab, width = shape
    blocks = raw.reshape(vocab, width // BLOCK, BLOCK_LAYOUT["Q8_0"][1])
    weight_scales = _f16(blocks[..., :2])[..., 0]  # [vocab, nb]
    q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float64)  # [vocab, nb, 32]
    high = torch.floor(q / 16)
    rest = _norm_bytes((q - 16 * high - 8).pow(2).sum(dim=2)).to(torch.float32)
    levels, scales, _, norms = activations(x)
    full = torch.einsum("nbk,vbk->nvb", levels, q)
    approx = torch.einsum("nbk,vbk->nvb", levels, 16 * high + 8)
    is_exact = _exact_marks(exact_blocks, width // BLOCK).bool()[None, None, :]
    integers = torch.where(is_exact, full, approx).to(torch.float32)
    c = weight_scales[None] * scales[:, None, :]
    terms = c * integers
    remainder = torch.where(is_exact, torch.zeros_like(c), (c.abs() * rest[None]) * norms[:, None, :])
    p, magnitude, r = (_in_order(t) for t in (terms, terms.abs(), remainder))
    k_rem, k_sum = constants(width)
    return p, (r * k_rem + magnitude * k_sum) + FLOOR


def _in_order(terms: torch.Tensor) -> torch.Tensor:
    """[n, vocab, nb] float32 -> [n, vocab]: +0 + t_0 + t_1 + ..., one rounding per addition."""
    acc = torch.zeros(terms.shape[:2], dtype=torch.float32)
    for b in range(terms.shape[2]):
        acc = acc + terms[:, :, b]
    return acc


def _exact_marks(exact_blocks: Sequence[int], blocks: int) -> torch.Tensor:
    """Block indices -> uint8 [blocks], 1 at each (refused outside [0, blocks))."""
    marks = torch.zeros(blocks, dtype=torch.uint8)
    for block in exact_blocks:
        if not 0 <= block < blocks:
            raise ValueError(f"CompactHead: exact block {block} is not one of the head's {blocks} blocks")
        marks[block] = 1
    return marks


def _norm_bytes(squares: torch.Tensor) -> torch.Tensor:
    """Integer sums of squares (at most 32 * 64) -> uint8 ceil(4 sqrt(s)), checked exactly in integers."""
    s = squares.to(torch.int64)
    m = torch.ceil(4 * torch.sqrt(s.double())).to(torch.int64)
    m = torch.where((m - 1).clamp_min(0).pow(2) >= 16 * s, m - 1, m)
    m = torch.where(m.pow(2) < 16 * s, m + 1, m)
    return m.to(torch.uint8)


def _sqrt_up(squares: torch.Tensor) -> torch.Tensor:
    """Exact integer sums of squares (float64) -> float32 at or above their square roots (checked by squaring, exact
    in float64)."""
    root = torch.sqrt(squares).to(torch.float32)
    while True:
        short = root.double().pow(2) < squares
        if not bool(short.any()):
            return root
        root = torch.where(short, torch.nextafter(root, torch.tensor(math.inf)), root)


def _up(value: float) -> float:
    """The float32 at or above a positive float64 value."""
    down = torch.tensor(value, dtype=torch.float32)
    return float(down if float(down) >= value else torch.nextafter(down, torch.tensor(math.inf)))
