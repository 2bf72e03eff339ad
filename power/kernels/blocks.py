"""Random GGUF rows for kernel checks: every quant bit pattern random, the float16 scales finite.

The tests and `power.app.gpu_check` both multiply these; one place makes them.
"""

from __future__ import annotations

import numpy as np
import torch

from power.kernels.dequant import BLOCK_LAYOUT

# Byte offsets of each block's float16 scale fields (d, and dmin for Q4_K/Q5_K).
SCALE_FIELDS = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, rows: int, cols: int, seed: int, scale: float | None = None) -> torch.Tensor:
    """GGUF rows [rows, row_bytes] of random quants with finite float16 scales (or random float16 weights for F16).

    Every quant/scale bit pattern is random; the float16 scale fields are random
    normals * 0.01, or exactly `scale` when given (a power of two keeps products exact).
    """
    if qtype == "F16":  # no blocks: every weight a float16, normals * 0.01 or small integers * `scale`
        rng = np.random.default_rng(seed)
        values = rng.integers(-8, 8, (rows, cols)) * scale if scale is not None else rng.standard_normal((rows, cols))
        weights = values if scale is not None else values * 0.01
        return torch.from_numpy(weights.astype(np.float16).view(np.uint8).reshape(rows, -1).copy())
    per_block, block_bytes = BLOCK_LAYOUT[qtype]
    n_blocks = rows * cols // per_block
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        values = np.full(n_blocks, scale) if scale is not None else rng.standard_normal(n_blocks) * 0.01
        raw[:, offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return torch.from_numpy(raw.reshape(rows, -1))
