"""Whether a tensor's floats are all finite: its weights (F32, F16, BF16) or its blocks' float16 scales.

A NaN or Inf weight or scale turns every logit it reaches into NaN, and greedy
decoding then picks token 0 forever; the loader refuses such a file instead
(PWR126). Quantised blocks are judged by their scale fields alone
(`power.kernels.blocks.SCALE_FIELDS`): their quants are small integers, always
finite, so a block's values are finite exactly when its scales are.
"""

from __future__ import annotations

import torch

from power.kernels.blocks import SCALE_FIELDS
from power.kernels.dequant import BLOCK_LAYOUT

FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_CHUNK = 1 << 24  # elements judged at a time, so the mask beside a large tensor stays small


def first_non_finite(qtype: str, raw: torch.Tensor) -> int | None:
    """The byte offset in `raw` (a tensor's flat uint8 bytes) of its first non-finite weight or scale, or None
    when all are finite (or `qtype` is not one the runtime reads: `GGUFFile.expect` refuses those)."""
    if qtype in FLOAT_TYPES:
        values = raw.view(FLOAT_TYPES[qtype])
        for start in range(0, values.numel(), _CHUNK):
            if (index := _first_non_finite(values[start:start + _CHUNK])) is not None:
                return (start + index) * values.element_size()
        return None
    if qtype not in SCALE_FIELDS:
        return None
    block_bytes = BLOCK_LAYOUT[qtype][1]
    blocks = raw.view(-1, block_bytes)
    found = [(block * block_bytes + field) for field in SCALE_FIELDS[qtype]
             if (block := _first_non_finite(blocks[:, field:field + 2].view(torch.float16))) is not None]
    return min(found, default=None)


def _first_non_finite(values: torch.Tensor) -> int | None:
    finite = torch.isfinite(values).flatten()
    return None if bool(finite.all()) else int((~finite).nonzero()[0])
