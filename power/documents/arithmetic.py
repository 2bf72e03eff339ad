"""The arithmetic a plan's matrix products run in (the plan's `runtime.arithmetic`), importable without torch.

- `quantised`: the weights stay quantised in memory and every matrix product is
  an integer product with exact int32 sums, after a per-row quantisation of the
  activations (`power.runtime.linear`). A row's result is the same bits whatever
  the number of rows in the call, so every forward runs on its real rows only: a
  plain round is one row, a speculative round K+1, a batch the sum of its
  requests' rows.
- `float32`: the reference. Every matrix is dequantised exactly to float32, and
  since float GEMMs do not promise a row the same bits at another row count,
  every forward is padded to the plan's fixed shape (the verification capacity,
  the prefill chunk). Four bytes a weight; for checking the quantised path
  against the exact weights, not for serving.

A profile may name one, or `auto` (the default): the fastest exact arithmetic of
the machine, which is `quantised`. The plan seals the resolved name, so `run`,
`serve` and `bench` of one plan give the same tokens.
"""

from __future__ import annotations

from typing import Final, Literal

QUANTISED: Final = "quantised"
FLOAT32: Final = "float32"
AUTO: Final = "auto"

Arithmetic = Literal["quantised", "float32"]
ARITHMETICS: Final = (QUANTISED, FLOAT32)
REQUESTABLE: Final = (AUTO, *ARITHMETICS)


def resolve(requested: str) -> str:
    """A profile's `arithmetic` -> the plan's: `auto` is the fastest exact one, the quantised products."""
    return QUANTISED if requested == AUTO else requested
