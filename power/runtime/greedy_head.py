"""An exact greedy LM head: the argmax of the full product from a cheap pass over the vocabulary and a few exact rows.

Greedy decoding and greedy verification need each row's argmax (the lowest token
ID on ties), not every logit. `GreedyHead` wraps an exact head (a `Linear` whose
`select(x, rows)` gives chosen output columns bit-identical to the full product)
and finds that argmax by bound and refine:

1. a cheap pass scores every token approximately, p_v, with a rigorous bound
   |s_v - p_v| <= b_v on the exact score s_v of every token v;
2. a token can be the argmax only if its upper bound p_v + b_v reaches the best
   lower bound max_w (p_w - b_w): every argmax is in that candidate set, because
   s_v* = max s >= s_w >= p_w - b_w for the w that attains the best lower bound,
   and s_v* <= p_v* + b_v*;
3. the exact scores of the candidates (`select`, the same bits as the full
   product) decide; candidates are taken in increasing token ID, so the first
   maximum is the lowest ID, as in `torch.argmax` of the full row.

The cheap pass splits the input channels in two. The `channels` that carry most
of the activation energy (a few outlier channels; `outlier_channels` picks them
from sample rows) are multiplied in float32 with the weights rounded to float32;
the rest through torch's int4 weight-only CPU kernel
(`aten._weight_int4pack_mm_for_cpu`, groups of `GROUP` input channels,
symmetric: w' = (q - 8) s with q in [0, 15], the group's scale s in bfloat16
rounded up so no weight clips) on bfloat16 activations. The choice of channels
only decides how tight the bound is, never whether it holds.

The bound. Let x~ be the activation row as the exact head uses it
(`exact.effective_input`, float64: a `QuantLinear`'s int8 activation blocks times their scales)
and w_v the exact head's weight row (`exact.dequantised`). Per part P (the
float32 channels, the int4 channels) with approximate weights w'_P, the
activation as that part's kernel reads it x^_P, kernel output p_P:

    s_v - p_v = (s_v - x~.w_v)                                  (a) exact head's rounding
              + sum_P x~_P.(w_P - w'_P)                         (b) approximate weights
              + sum_P (x~_P - x^_P).w'_P                        (c) activation rounding
              + sum_P (x^_P.w'_P - p_P)                         (d) the kernels' float arithmetic
              + (p_O + p_R - fl(p_O + p_R))                     (e) adding the two parts

(a) <= c ||x~|| ||w_v||, with c the exact head's `rounding` (it documents its
own); (b) and (c) by Cauchy-Schwarz: <= ||x~_P|| ||w_v,P - w'_v,P|| and
<= ||x~_P - x^_P|| ||w'_v,P||; (d): a float32 dot product of n terms, summed in
any order and then rounded once to the output type with unit roundoff u_out,
differs from the exact dot product by at most (gamma_{n+2} (1 + u_out) + u_out)
sum_k |x^_k w'_k| <= that factor times ||x^_P|| ||w'_v,P|| (Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., eq. 3.5 and Lemma 3.1; gamma_m =
m u / (1 - m u), u = 2^-24; the two extra terms cover a per-group scale
multiplication and the conversion of the bf16 product of an int4 level and a
bf16 scale, which is exact in float32). (e) <= u |p_v| <= u (sum_P ||x^_P||
||w'_v,P||) (1 + gamma). The per-row norms of the weights are computed once, in
float64, and rounded up to float32; the per-activation norms at each call, in
float64. The bound of each (row, token) is a sum of nonnegative products formed
as a small float32 matrix product ([n, 6] x [6, vocab]); its own rounding is at
most gamma_7 relative, and the comparison p_v +- b_v in float32 adds at most
u (|p_v| + b_v). `SAFETY` multiplies the whole bound and an absolute `FLOOR`
is added, both far above those last two terms. `tests/test_greedy_head.py`
checks |s_v - p_v| <= b_v on every one of Gemma's 262,144 rows over real hidden
states.

Sampling (temperature > 0) needs the whole distribution and keeps the full head.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import torch

from power.runtime.errors import RuntimeInputError

GROUP = 32  # int4 group size (input channels per scale)
INT4_ZERO = 8  # torch's int4 CPU kernel dequantises (q - 8) * scale + zero; zero is 0 here
UNIT = 2.0**-24  # float32 unit roundoff
BF16_UNIT = 2.0**-8  # bfloat16 unit roundoff
SAFETY = 1 + 2.0**-10  # covers the float32 rounding of forming the bound (gamma_7) many times over
FLOOR = 1e-4  # absolute slack for the float32 additions of scores and bounds
VOCAB_CHUNK = 16384  # vocabulary rows prepared at a time at load (float64 working set)


class ExactRows(Protocol):
    """What an exact head offers to be refined: chosen columns of its product, and its arithmetic's description."""

    shape: tuple[int, int]

    @property
    def rounding(self) -> float:
        """c with |s_v - effective_input(x) . w_v| <= c ||effective_input(x)|| ||w_v|| for every row and token."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def select(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> [n, len(rows)], bit-identical to self(x)[:, rows]."""

    def effective_input(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] -> float64 [n, in]: the activation rows exactly as the products use them."""

    def dequantised(self, begin: int, end: int) -> torch.Tensor:
        """Weight rows [begin, end) as float64 [end - begin, in]: the values the products multiply by."""


def gamma(n: int, unit: float = UNIT) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n roundings."""
    return n * unit / (1 - n * unit)


def outlier_channels(rows: torch.Tensor, count: int) -> list[int]:
    """The `count` input channels with the most energy over sample activation rows [m, in], in increasing order."""
    energy = rows.double().pow(2).sum(dim=0)
    return sorted(energy.argsort(descending=True)[:count].tolist())


class GreedyHead:
    """argmax of `exact(x)` per row, bit-identical, from a cheap bounded pass and the exact scores of a few tokens."""

    def __init__(self, exact: ExactRows, channels: Sequence[int]) -> None:
        vocab, width = exact.shape
        kept = torch.zeros(width, dtype=torch.bool)
        kept[list(channels)] = True
        if (width - int(kept.sum())) % GROUP:
            raise RuntimeInputError(f"the head's {width} input channels less the {int(kept.sum())} float32 ones must "
                                    f"be a whole number of int4 groups of {GROUP}")
        self.exact, self.shape = exact, exact.shape
        self._dense = kept.nonzero().flatten()
        self._rest = (~kept).nonzero().flatten()
        dense_t = torch.empty(len(self._dense), vocab, dtype=torch.float32)
        levels = torch.empty(vocab, len(self._rest), dtype=torch.int32)
        scales = torch.empty(len(self._rest) // GROUP, vocab, dtype=torch.bfloat16)
        # Per token: ||w_v||, ||w_O - w'_O||, ||w'_O||, ||w_R - w'_R||, ||w'_R||  (float64, rounded up to float32)
        norms = torch.empty(5, vocab, dtype=torch.float64)
        for begin in range(0, vocab, VOCAB_CHUNK):
            end = min(begin + VOCAB_CHUNK, vocab)
            w = exact.dequantised(begin, end)
            w_dense, w_rest = w[:, self._dense], w[:, self._rest]
            approx_dense = w_dense.to(torch.float32)
            q, s = _int4_symmetric(w_rest)
            approx_rest = ((q - INT4_ZERO).double().view(end - begin, -1,
                                                         GROUP) * s.double().t()[:, :, None]).flatten(1)
            dense_t[:, begin:end] = approx_dense.t()
            levels[begin:end], scales[:, begin:end] = q, s
            norms[:, begin:end] = torch.stack((w.norm(dim=1), (w_dense - approx_dense.double()).norm(dim=1),
                                               approx_dense.double().norm(dim=1), (w_rest - approx_rest).norm(dim=1),
                                               approx_rest.norm(dim=1)))
        self._dense_t = dense_t
        self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)
        self._scales_zeros = torch.stack((scales, torch.zeros_like(scales)), dim=2).contiguous()  # [groups, vocab, 2]
        self._norms = _round_up_float32(norms)
        n_dense, n_rest = len(self._dense), len(self._rest)
        self._dense_arith = gamma(n_dense + 2)  # float32 sgemm, output float32
        self._rest_arith = gamma(n_rest + 2) * (1 + BF16_UNIT) + BF16_UNIT  # float32 sums, output rounded to bf16
        self.last_candidates: list[int] = []  # candidate-set size per row of the last call (for benchmarks)

    def approximate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in] -> (p [n, vocab] float32, b [n, vocab] float32) with |exact(x)[i, v] - p[i, v]| <= b[i, v]."""
        effective = self.exact.effective_input(x)  # float64, exact
        dense_in, rest_in = effective[:, self._dense], effective[:, self._rest]
        dense_32, rest_16 = dense_in.to(torch.float32), rest_in.to(torch.bfloat16)
        p = dense_32 @ self._dense_t
        p += torch.ops.aten._weight_int4pack_mm_for_cpu(rest_16, self._packed, GROUP,
                                                        self._scales_zeros).to(torch.float32)
        dense_hat, rest_hat = dense_32.double().norm(dim=1), rest_16.double().norm(dim=1)
        e_norm = effective.norm(dim=1)
        row_terms = torch.stack(
            (
                self.exact.rounding * e_norm,  # (a) x ||w_v||
                dense_in.norm(dim=1),  # (b) x ||w_O - w'_O||
                (dense_in - dense_32.double()).norm(dim=1)
                + (self._dense_arith + 2 * UNIT) * dense_hat,  # (c, d, e) x ||w'_O||
                rest_in.norm(dim=1),  # (b) x ||w_R - w'_R||
                (rest_in - rest_16.double()).norm(dim=1)
                + (self._rest_arith + 2 * UNIT) * rest_hat,  # (c, d, e) x ||w'_R||
            ),
            dim=1,
        )
        bound = _round_up_float32(row_terms) @ self._norms
        return p, bound.mul_(SAFETY).add_(FLOOR)

    def candidates(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per row, the increasing token IDs whose upper bound reaches the row's best lower bound."""
        p, bound = self.approximate(x)
        best_lower = (p - bound).amax(dim=1, keepdim=True)
        keep = (p + bound) >= best_lower
        return [row.nonzero().flatten() for row in keep]

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] float32 -> [n] int64: the argmax of each row of exact(x), lowest token ID on ties."""
        per_row = self.candidates(x)
        self.last_candidates = [len(rows) for rows in per_row]
        union = torch.unique(torch.cat(per_row))  # sorted: the first maximum is the lowest token ID
        scores = self.exact.select(x, union)
        return union[scores.argmax(dim=1)]


def _int4_symmetric(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, in] float64 -> levels [rows, in] int32 in [0, 15] and bf16 scales [in / GROUP, rows], w ~ (q - 8) s.

    Each group's scale is the smallest bf16 with -8 s <= min w and max w <= 7 s (rounded up from the float64
    quotient), so no weight clips; the levels are round(w / s) + 8.
    """
    groups = w.view(w.shape[0], -1, GROUP)
    need = torch.maximum(groups.amax(dim=2) / 7, -groups.amin(dim=2) / 8).clamp_min(2.0**-100)  # [rows, groups]
    scale = need.to(torch.bfloat16)
    short = scale.double() < need
    # The next bfloat16 up: a positive bf16's bits read as an integer are monotone in its value.
    scale[short] = (scale[short].view(torch.int16) + 1).view(torch.bfloat16)
    levels = torch.round(groups / scale.double()[:, :, None]).clamp(-INT4_ZERO, INT4_ZERO - 1) + INT4_ZERO
    return levels.flatten(1).to(torch.int32), scale.t().contiguous()


def _round_up_float32(values: torch.Tensor) -> torch.Tensor:
    """float64 -> the float32 at or above each value (nonnegative values)."""
    down = values.to(torch.float32)
    return torch.where(down.double() < values, torch.nextafter(down, torch.tensor(math.inf)), down)
