"""Batch-invariant quantised matmul: row results ignore their neighbours; both paths within the fp32 bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_helpers import on_both_paths, random_blocks

from power.kernels import dispatch
from power.kernels.dequant import dequantize_reference
from power.kernels.qmatmul import SUPPORTED, step_size
from power.runtime.gguf_weights import GGUFFile

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

GEMMA = Path(__file__).resolve().parents[1] / "models" / "gemma-3-270m-q4_k_m.gguf"
N_OUT = 37  # odd, and not a multiple of the column tile


def inner_size(qtype: str) -> int:
    """An odd number of the product's steps per row: 3 x 32 for the 32-weight types and F16, 1 x 256 for K-quants."""
    step = step_size(qtype)
    return step * (3 if step == 32 else 1)


def fp32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|y - y_exact| <= gamma_K * (|x| @ |W|.T), gamma_K = K u / (1 - K u), u = 2^-24 (fp32 accumulation)."""
    k = x.shape[1]
    u = 2.0**-24
    return k * u / (1 - k * u) * (x.double().abs() @ w.double().abs().T)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED))
def test_a_rows_result_is_independent_of_the_rows_beside_it(monkeypatch, qtype):
    inner = inner_size(qtype)
    weight = random_blocks(qtype, N_OUT, inner, seed=11)
    x = torch.randn(17, inner, generator=torch.Generator().manual_seed(5))
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)
        full = dispatch.qmatmul(x, weight, qtype)
        for rows in range(1, 18):
            assert torch.equal(dispatch.qmatmul(x[:rows].contiguous(), weight, qtype), full[:rows]), (path, rows)
        assert torch.equal(dispatch.qmatmul(x[9:10].contiguous(), weight, qtype), full[9:10]), path


@pytest.mark.parametrize("qtype", sorted(SUPPORTED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_both_paths_stay_within_the_fp32_bound_of_the_exact_product(monkeypatch, qtype, dtype):
    inner = inner_size(qtype)
    weight = random_blocks(qtype, N_OUT, inner, seed=3)
    x = torch.randn(5, inner, generator=torch.Generator().manual_seed(2)).to(dtype)
    w = dequantize_reference(qtype, weight.reshape(-1), (N_OUT, inner))
    exact = x.double() @ w.double().T
    for y in on_both_paths(monkeypatch, dispatch.qmatmul, x, weight, qtype):
        assert y.dtype == torch.float32 and y.shape == (5, N_OUT)
        assert bool(((y.double() - exact).abs() <= fp32_bound(x, w)).all())


@pytest.mark.parametrize("qtype", sorted(SUPPORTED))
def test_exactly_representable_products_agree_to_the_bit(monkeypatch, qtype):
    """Scales of 2^-8 and x in {-1, 0, 1}: every partial sum is exact, so any order gives the same bits."""
    inner = inner_size(qtype)
    weight = random_blocks(qtype, N_OUT, inner, seed=8, scale=2.0**-8)
    x = torch.randint(-1, 2, (3, inner), generator=torch.Generator().manual_seed(4)).float()
    w = dequantize_reference(qtype, weight.reshape(-1), (N_OUT, inner))
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.qmatmul, x, weight, qtype)
    assert torch.equal(triton_out, reference_out)
    assert torch.equal(triton_out.double(), x.double() @ w.double().T)


def test_real_gemma_projection_rows_are_batch_invariant(monkeypatch):
    """A real Q4_K projection from Gemma 3 270M (first 40 output rows, 1024 inputs)."""
    gemma = GGUFFile(GEMMA)
    info = gemma.info("blk.0.attn_output.weight")
    assert info.qtype == "Q4_K"
    row_bytes = info.nbytes // info.shape[0]
    weight = gemma.raw(info.name)[: 40 * row_bytes].reshape(40, row_bytes)
    x = torch.randn(3, info.shape[1], generator=torch.Generator().manual_seed(0))
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.qmatmul, x, weight, "Q4_K")
    monkeypatch.setenv("POWER_KERNELS", "triton")
    assert torch.equal(dispatch.qmatmul(x[:1].contiguous(), weight, "Q4_K"), triton_out[:1])
    w = dequantize_reference("Q4_K", weight.reshape(-1), (40, info.shape[1]))
    exact = x.double() @ w.double().T
    for y in (triton_out, reference_out):
        assert bool(((y.double() - exact).abs() <= fp32_bound(x, w)).all())
