"""The torch reference of the CPU products: the arithmetic of `power.kernels.cpu`, step for step, in plain torch.

Integer sums are computed in float64, where every partial sum of these products is an integer below 2^53 and
so exact; every float32 step is one torch op (no fused multiply-add), and the per-block terms are added in
block order. Slow and exact; every instruction path is tested against it bit for bit.
"""

from __future__ import annotations

import torch

from power.kernels.dequant import BLOCK_LAYOUT, QK_K, _f16, _k_scales_mins, _nibbles, dequantize_reference

ACTIVATION_BLOCK = {"Q8_0": 32, "Q4_0": 32, "Q5_0": 32, "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K}


def quantize_rows(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, in] float32 -> (q [n, in / block, block] float64 integers in [-127, 127], d [n, in / block] float32)."""
    blocks = x.reshape(x.shape[0], -1, block)
    d = blocks.abs().amax(dim=-1) / 127
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse[..., None]).clamp(-127, 127)
    return q.to(torch.float64), d


def matmul(qtype: str, raw: torch.Tensor, shape: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
    """x [n, in] float32 times the GGUF matrix `raw` of `shape` [out, in], transposed -> [n, out] float32."""
    out_features, in_features = shape
    block, type_size = BLOCK_LAYOUT[qtype]
    if qtype in ("F32", "F16", "BF16"):
        return _float_rows(x, dequantize_reference(qtype, raw, shape))
    blocks = raw.reshape(out_features, in_features // block, type_size)
    xq, dx = quantize_rows(x, ACTIVATION_BLOCK[qtype])
    return _add_in_order(_TERMS[qtype](blocks, xq, dx))


def _float_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = acc + weight[:, k] * x[:, k:k + 1]
    return acc


def _add_in_order(terms: torch.Tensor) -> torch.Tensor:
    """[n, out, blocks] float32 -> [n, out]: 0 + t_0 + t_1 + ..., one rounding per addition."""
    acc = torch.zeros(terms.shape[:2], dtype=torch.float32)
    for b in range(terms.shape[2]):
        acc = acc + terms[:, :, b]
    return acc


def _dots(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """xq [n, nb, ..., k], wq [out, nb, ..., k] integers -> exact sums [n, out, nb, ...] (float64)."""
    return torch.einsum("nb...k,ob...k->nob...", xq, wq.to(torch.float64))


def _block32_terms(d: torch.Tensor, wq: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """w = d * q over blocks of 32: term = (d_w * d_x) * isum."""
    isum = _dots(xq, wq).to(torch.float32)  # [n, out, nb]
    return (d[None, :, :, 0] * dx[:, None, :]) * isum


def _q8_0(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    q = blocks[..., 2:].contiguous().view(torch.int8)
    return _block32_terms(_f16(blocks[..., :2]), q, xq, dx)


def _q4_0(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[..., 2:]).flatten(-2).to(torch.int16) - 8
    return _block32_terms(_f16(blocks[..., :2]), q, xq, dx)


def _q5_0(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    high = blocks[..., 2:6].contiguous().view(torch.int32)  # [out, nb, 1]
    fifth = (high >> torch.arange(32, dtype=torch.int32)) & 1
    q = (_nibbles(blocks[..., 6:]).flatten(-2).to(torch.int32) | (fifth << 4)) - 16
    return _block32_terms(_f16(blocks[..., :2]), q, xq, dx)


def _k_terms(blocks: torch.Tensor, q: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K, q [out, nb, 8, 32] unsigned: term = (d_x * d) * sum_j sc_j dot_j - (d_x * dmin) * sum_j m_j xsum_j."""
    sc, mn = (t.to(torch.float64) for t in _k_scales_mins(blocks[..., 4:16].reshape(-1, 12)))
    sc, mn = sc.reshape(*q.shape[:3]), mn.reshape(*q.shape[:3])
    xq = xq.reshape(*xq.shape[:2], 8, 32)
    scaled = (_dots(xq, q) * sc).sum(-1).to(torch.float32)  # [n, out, nb]
    mins = (xq.sum(-1)[:, None] * mn).sum(-1).to(torch.float32)
    d, dmin = _f16(blocks[..., 0:2])[..., 0], _f16(blocks[..., 2:4])[..., 0]
    return (dx[:, None, :] * d) * scaled - (dx[:, None, :] * dmin) * mins


def _q4_k(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[..., 16:].reshape(*blocks.shape[:2], 4, 32)).reshape(*blocks.shape[:2], 8, 32)
    return _k_terms(blocks, q, xq, dx)


def _q5_k(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    fifth = (blocks[..., None, 16:48] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1  # [out, nb, 8, 32]
    low = _nibbles(blocks[..., 48:].reshape(*blocks.shape[:2], 4, 32)).reshape(*blocks.shape[:2], 8, 32)
    return _k_terms(blocks, low | (fifth << 4), xq, dx)


def _q6_k(blocks: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """term = (d_x * d) * sum_j sc_j dot_j over 16 sub-blocks of 16, q - 32 signed, sc_j int8."""
    lead = blocks.shape[:2]
    low = _nibbles(blocks[..., :128].reshape(*lead, 2, 64)).reshape(*lead, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(4, 1)
    high = ((blocks[..., 128:192].reshape(*lead, 2, 1, 32) >> shifts) & 3).reshape(*lead, 8, 32)
    q = ((low | (high << 4)).to(torch.int16) - 32).reshape(*lead, 16, 16)
    scales = blocks[..., 192:208].contiguous().view(torch.int8).to(torch.float64)  # [out, nb, 16]
    sums = (_dots(xq.reshape(*xq.shape[:2], 16, 16), q) * scales).sum(-1).to(torch.float32)
    d = _f16(blocks[..., 208:210])[..., 0]
    return (dx[:, None, :] * d) * sums


_TERMS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
