"""An exact greedy LM head: the argmax of the full product from a cheap bounded pass and a few exact rows.

Greedy decoding and greedy verification need each row's argmax (the lowest token ID on ties), not every logit.
`GreedyHead` holds the runtime's Q8_0 head (a `QuantLinear`) once, in the form its pass reads (the full product,
rows and exact scores read the same bytes), and finds that argmax by bound and refine:

1. the cheap pass (`power.kernels.cpu.greedy.CompactHead.bounded`) scores every token, p_v, with a rigorous bound:
   lower_v = fl(p_v - b_v) <= s_v <= fl(p_v + b_v) = upper_v for the full product's score s_v of every token v.
   It reads each weight's high nibble (4 of its 8 bits) and, in a fixed set of `exact_blocks` blocks of 32 input
   channels (chosen at construction, e.g. by `calibrated_blocks` where rows like the caller's carry the most
   activation), all 8 bits, as one contiguous stream; the bound covers the low nibbles it leaves out (per block,
   Cauchy-Schwarz on exact integer sums) and every float rounding of both products (proof: that module);
2. a token can be the argmax only if upper_v reaches the best lower bound max_w lower_w: every argmax is in that
   candidate set, because s_v* = max s >= s_w >= lower_w for the w that attains the best lower bound, and
   s_v* <= upper_v*;
3. the exact scores of the candidates (the same bits as the full product) decide; candidates are taken in
   increasing token ID, so the first maximum is the lowest ID, as in `torch.argmax` of the full row.

All three steps run in one kernel call (`CompactHead.argmax`): the pass keeps per 16-token tile only its largest
lower and upper bounds, and every token of a tile whose largest upper bound reaches the best lower bound is scored
exactly (a token scored beyond the candidates cannot win: its score is below its upper bound, below the best lower
bound, at most the maximum), as a tile's weights are read whole anyway.

Which blocks are exact decides only how many candidates there are, never whether the argmax is among them. A
row whose pass is not finite (an infinite or NaN activation) takes the full head, so the answer is always the
full head's. Sampling (temperature > 0) needs the whole distribution and keeps the full head.

A trunk takes it at load where `power.documents.greedy_head` allows (`head_refusal` says why not), its exact blocks
calibrated on the normed final rows of `CALIBRATION_TEXT` (`GreedyHead.calibrated`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from power.documents import greedy_head as rule
from power.kernels.cpu import QuantMatrix
from power.kernels.cpu.greedy import CompactHead, calibrated_blocks
from power.runtime.errors import RuntimeInputError
from power.runtime.linear import Linear, QuantLinear

# Rows like a deployment's: prose, numbers and code. Over real Gemma 3 270M rows, blocks calibrated on a mixed text
# leave a median of ~410 candidate tiles a row, those of the output norm's weight alone ~1,300 (docs/runtime.md).
CALIBRATION_TEXT = ("The quick brown fox jumps over the lazy dog. In 1492, Columbus sailed the ocean blue; "
                    "def f(x): return x * 2")
TURNED_OFF = "turned off (--greedy-head off)"


def head_refusal(head: Linear, softcap: float | None, enabled: bool) -> str | None:
    """Why a trunk with this LM head and final logit softcap keeps the full head for every row (None: it takes the
    greedy head for greedy rows); `enabled`: the operator's choice (`--greedy-head`)."""
    if not enabled:
        return TURNED_OFF
    if not isinstance(head, QuantLinear):
        return rule.refusal(head.path, head.shape[0], softcap, cpu_kernels=False)
    return rule.refusal(head.matrix.qtype, head.shape[0], softcap, cpu_kernels=True)


class GreedyHead:
    """argmax of `exact(x)` per row, bit-identical, from a cheap bounded pass and the exact scores of a few tokens.

    It holds the Q8_0 head `exact` once, as the pass's stream and the low nibbles it leaves out
    (`power.kernels.cpu.greedy.CompactHead`): `head` is that head as a `QuantLinear`, the same product, rows and bits
    as `exact`, for the trunk to keep in `exact`'s place, whose Q8_0 tiles can then go."""

    def __init__(self, exact: Linear, exact_blocks: Sequence[int]) -> None:
        matrix = exact.matrix if isinstance(exact, QuantLinear) else None
        if not isinstance(matrix, QuantMatrix) or matrix.qtype != "Q8_0":
            raise RuntimeInputError(f"an exact greedy head reads a Q8_0 head on the CPU kernels; this head is "
                                    f"{getattr(exact, 'path', type(exact).__name__)}")
        self.shape = exact.shape
        self._compact = CompactHead(matrix, exact_blocks)
        self.head = QuantLinear(self._compact)
        self._replaced = exact.nbytes
        self.last_candidate_tiles: list[int] = []  # 16-token tiles refined per row of the last call (benchmarks)

    @classmethod
    def calibrated(cls, exact: Linear, rows: torch.Tensor) -> GreedyHead:
        """The greedy head over `exact` whose exact blocks are those where the normed final rows `rows` carry the most
        activation (`calibrated_blocks`)."""
        return cls(exact, calibrated_blocks(rows, rule.exact_blocks(exact.shape[1])))

    @property
    def exact_blocks(self) -> list[int]:
        return self._compact.exact.nonzero().flatten().tolist()

    @property
    def nbytes(self) -> int:
        """What holding the head this way costs beyond its Q8_0 tiles: a norm byte per row and bounded block."""
        return self._compact.nbytes - self._replaced

    def bounds(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in] -> (lower, upper) float32 [n, vocab] with lower <= exact(x) <= upper."""
        p, bound = self._compact.bounded(x)
        return p - bound, p + bound

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] float32 -> [n] int64: the argmax of each row of exact(x), lowest token ID on ties: by bound and
        refine for at most `rule.ROWS` rows, else from the full product reduced in the kernel."""
        if x.shape[0] <= rule.ROWS:
            tokens, tiles = self._compact.argmax(x)
            self.last_candidate_tiles = tiles.tolist()
        else:
            tokens = self._compact.full_argmax(x)
        unbounded = tokens < 0
        if bool(unbounded.any()):
            tokens[unbounded] = self.head(x[unbounded]).argmax(dim=1)
        return tokens
