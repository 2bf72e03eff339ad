"""The trunks' per-row float32 operations on the CPU, and their torch references.

API (float32, contiguous, on the CPU; `path` as for `QuantMatrix`, default the chosen one)
------------------------------------------------------------------------------------------
- `rms_norm(x [R, d] or [..., d], weight [W, d] or [d], eps)`: row r uses weight row r % W.
- `rope(x [n, heads, hd], cos [n, hd / 2], sin [n, hd / 2], neox)`.
- `attention(q [n, H, hd], k [Hkv, T, hd], v [Hkv, T, hdv], positions int64 [n], window, scale)` -> [n, H * hdv]:
  row i reads the cache slots up to its position (the last `window` of them for a sliding layer; None: all).
- `cache_write(rows [n, Hkv, w], caches [S, Hkv, T, stored w], slots int64 [n], positions int64 [n])`: row i into
  slot slots[i] at positions[i], rounded to the caches' type by itself (f32, f16, bf16; q8_0 as uint8 blocks)
  exactly as `power.runtime.kv_rows.encode` rounds it, its reference.
- `reference_rms_norm`, `reference_rope`, `reference_attention`: the same arithmetic in plain torch.

Arithmetic (csrc/rowops.cpp; every path compiles the same code with -ffp-contract=off)
--------------------------------------------------------------------------------------
A sum of products `dot(a, b)` over d values: lane l (of 16) adds a_k b_k for k = l, l + 16, ... in order, then
the lanes fold 8 + 8, 4 + 4, 2 + 2, 1 + 1. RMS norm: `(x_k * (1 / sqrt(dot(x, x) / d + eps))) * w_k`. Rope:
`(a cos - b sin, a sin + b cos)` per pair. Attention per row and head: `s_j = dot(q, k_j) * scale` over the
readable slots j, `e_j = exp(s_j - max s)`, the e_j and the products e_j v_j summed in slot order, then divided.

Nothing reads another row, so a row's bits are the same at any row count; the references reproduce the norm and
the rope bit for bit. The attention's `exp` is the C library's `expf`, which torch's vectorised `exp` does not
promise to match to the last bit, so its reference agrees within a few ulps, and the instruction paths are
tested against each other for equal bits.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from power.kernels.cpu.build import chosen_path, extension

LANES = 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, path: str | None = None) -> torch.Tensor:
    return _ops(path).rms_norm(x.contiguous(), weight.contiguous(), eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool, path: str | None = None) -> torch.Tensor:
    return _ops(path).rope(x.contiguous(), cos.contiguous(), sin.contiguous(), neox)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, window: int | None,
              scale: float, path: str | None = None) -> torch.Tensor:
    return _ops(path).attention(q.contiguous(), k, v, positions, window or 0, scale)


def cache_write(rows: torch.Tensor, caches: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                path: str | None = None) -> None:
    _ops(path).cache_write(rows, caches, slots, positions)


def _ops(path: str | None) -> Any:
    return _chosen_ops() if path is None else extension(chosen_path(path))


@functools.cache
def _chosen_ops() -> Any:
    """The chosen path's ops, looked up once: these ops give the same bits on every path, so a later change of
    POWER_CPU_PATH changes only their speed."""
    return extension(chosen_path())


# --- references ---------------------------------------------------------------------------------------------

def lane_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., d] x [..., d] -> [...]: the kernels' lane-ordered sum of products."""
    d = a.shape[-1]
    products = a * b
    padded = torch.nn.functional.pad(products, (0, -d % LANES)).unflatten(-1, (-1, LANES))  # [..., d/16, 16]
    acc = torch.zeros_like(padded[..., 0, :])
    for step in range(padded.shape[-2]):
        acc = acc + padded[..., step, :]
    width = LANES // 2
    while width:
        acc = acc[..., :width] + acc[..., width:2 * width]
        width //= 2
    return acc[..., 0]


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    weights = weight.reshape(-1, d)
    w = weights[torch.arange(rows.shape[0]) % weights.shape[0]]
    eps32 = torch.tensor(eps, dtype=torch.float32)
    # sqrt through float64: a correctly rounded float32 root, as the kernel's std::sqrt (torch's own float32 sqrt
    # is not correctly rounded on every CPU: 17 % of roots one ulp off on an AMD EPYC with AVX-512)
    inverse = 1.0 / torch.sqrt((lane_dot(rows, rows) / torch.tensor(float(d)) + eps32).double()).float()
    return ((rows * inverse[:, None]) * w).view(x.shape)


def reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    cos, sin = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                        window: int | None, scale: float) -> torch.Tensor:
    n, heads, _ = q.shape
    group = heads // k.shape[0]
    out = torch.zeros(n, heads, v.shape[2])
    for i, p in enumerate(positions.tolist()):
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            scores = lane_dot(q[i, h][None], k[h // group, lo:p + 1]) * torch.tensor(scale, dtype=torch.float32)
            weights = torch.exp(scores - scores.max())
            total = torch.zeros(())
            acc = torch.zeros(v.shape[2])
            for j in range(len(weights)):
                total = total + weights[j]
                acc = acc + weights[j] * v[h // group, lo + j]
            out[i, h] = acc / total
    return out.view(n, -1)
