"""Packed weights (`power.runtime.linear`): row independence, the quantised products at any row count, and their
error against the exact product."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import random_blocks
from spec_helpers import GEMMA

from power.kernels.cpu import QuantMatrix, chosen_path
from power.kernels.dequant import dequantize_reference
from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import BlockLinear, Float32Linear, QuantLinear, Stacked, quantised
from power.runtime.trunks.base import TrunkOptions, Weights

OUT, IN, ROWS = 300, 256, 8


def gguf_rows(qtype: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A [OUT, IN] matrix as random GGUF rows of `qtype`, and its exact dequantisation."""
    raw = random_blocks(qtype, OUT, IN, seed)
    return raw, dequantize_reference(qtype, raw.reshape(-1), (OUT, IN))


def activations(rows: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(seed))
    x[:, 7] *= 40  # an outlier channel, as in real hidden states
    return x


def cpu(qtype: str, seed: int = 0) -> QuantLinear:
    raw, _ = gguf_rows(qtype, seed)
    linear = quantised(raw.reshape(-1), qtype, (OUT, IN), "cpu")
    assert isinstance(linear, QuantLinear)
    return linear


@pytest.mark.parametrize("make", [lambda: Float32Linear(gguf_rows("Q8_0")[1], ROWS),
                                  lambda: Float32Linear(gguf_rows("Q8_0")[1], 1),
                                  lambda: cpu("Q4_K"), lambda: cpu("Q8_0")],
                         ids=["float32", "float32-one-row", "quantised-Q4_K", "quantised-Q8_0"])
def test_a_rows_result_ignores_the_rows_beside_it(make):
    linear = make()
    x = activations(ROWS, seed=1)
    together = linear(x)
    for j in range(ROWS):
        neighbours = activations(ROWS, seed=100 + j)
        neighbours[j] = x[j]
        assert torch.equal(linear(neighbours)[j], together[j]), f"row {j} changed with its neighbours"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0"])
def test_quantised_rows_are_the_same_bits_at_any_row_count_and_near_the_exact_product(qtype):
    raw, exact = gguf_rows(qtype)
    linear = cpu(qtype)
    x = activations(17, seed=5)
    full = linear(x)
    assert linear.row_count_invariant and linear.path == chosen_path()
    for rows in range(1, 17):
        assert torch.equal(linear(x[:rows]), full[:rows]), f"{rows} rows differ from the same rows among 17"
    # Each activation block is rounded to int8 steps d = max|x_block| / 127 (llama.cpp's Q8 activations): a result
    # is off the exact product by at most half a step per weight, plus float rounding.
    block = 256 if qtype.endswith("_K") else 32
    steps = x.double().abs().view(17, IN // block, block).amax(-1) / 127  # [rows, blocks]
    weight_mass = exact.double().abs().view(OUT, IN // block, block).sum(-1)  # [out, blocks]
    bound = steps @ weight_mass.T / 2
    error = (full.double() - x.double() @ exact.double().T).abs()
    assert (error <= bound * 1.001 + 1e-4 * (x.double().abs() @ exact.double().abs().T)).all()


def test_a_quantised_matrix_holds_its_gguf_bytes_and_a_float32_one_four_per_weight():
    raw, exact = gguf_rows("Q4_K")
    assert cpu("Q4_K").nbytes == QuantMatrix("Q4_K", raw.reshape(-1), (OUT, IN)).nbytes == 304 * raw.shape[1]
    assert Float32Linear(exact, ROWS).nbytes == OUT * IN * 4
    assert Float32Linear(exact, ROWS).path == "torch-float32"


def test_a_type_without_a_product_on_the_device_is_none():
    assert quantised(torch.zeros(OUT * IN // 32 * 24, dtype=torch.uint8), "Q5_1", (OUT, IN), "cpu") is None


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_gguf_rows_multiply_in_place_at_any_row_count(qtype):
    """The GPU's quantised packing: the file's rows and the batch-invariant product (its reference on the CPU)."""
    raw, exact = gguf_rows(qtype)
    linear = BlockLinear(raw, qtype, (OUT, IN))
    x = torch.randn(17, IN, generator=torch.Generator().manual_seed(3))
    full = linear(x)
    assert linear.row_count_invariant and linear.nbytes == raw.numel()
    torch.testing.assert_close(full, x @ exact.T, rtol=1e-5, atol=1e-4)
    for rows in range(1, 17):
        assert torch.equal(linear(x[:rows]), full[:rows]), f"{rows} rows differ from the same rows among 17"


def test_matrices_of_different_types_stack_side_by_side():
    (q4, exact4), (q8, exact8) = gguf_rows("Q4_K", 1), gguf_rows("Q8_0", 2)
    stacked = Stacked([BlockLinear(q4, "Q4_K", (OUT, IN)), BlockLinear(q8, "Q8_0", (OUT, IN))])
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(4))
    assert stacked.shape == (2 * OUT, IN) and stacked.nbytes == q4.numel() + q8.numel()
    assert stacked.row_count_invariant
    torch.testing.assert_close(stacked(x), x @ torch.cat((exact4, exact8)).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("packing", ["float32", "float32-one-row", "quantised-cpu", "gguf-rows"])
def test_a_packing_reads_its_rows_back_as_the_exact_dequantised_weights(packing):
    """What a tied embedding looks up: the head's own rows, in any packing, with the dequantiser's bits."""
    raw, exact = gguf_rows("Q6_K", 6)
    linear = {"float32": lambda: Float32Linear(exact, ROWS), "float32-one-row": lambda: Float32Linear(exact, 1),
              "quantised-cpu": lambda: quantised(raw.reshape(-1), "Q6_K", (OUT, IN), "cpu"),
              "gguf-rows": lambda: BlockLinear(raw, "Q6_K", (OUT, IN))}[packing]()
    assert linear is not None
    rows = torch.tensor([OUT - 1, 0, 17, 17, 250])
    assert torch.equal(linear.rows(rows), exact[rows])


def test_neighbours_of_one_gguf_type_stack_into_one_product_with_each_matrixs_bits():
    """A trunk's fused matrices (Gemma 3 270M's q, k (Q5_0) and v (Q8_0); gate and up (Q5_0)) are one product per
    run of one type, and give the bits of each matrix's own product side by side."""
    weights = Weights(GGUFFile(GEMMA), TrunkOptions(n_ctx=64, verify_capacity=1))
    x = torch.randn(3, 640, generator=torch.Generator().manual_seed(5))
    qkv = [("blk.0.attn_q.weight", [1024, 640]), ("blk.0.attn_k.weight", [256, 640]),
           ("blk.0.attn_v.weight", [256, 640])]
    gate_up = [("blk.0.ffn_gate.weight", [2048, 640]), ("blk.0.ffn_up.weight", [2048, 640])]
    for matrices, products in ((qkv, 2), (gate_up, 1)):
        built = len(weights.linears)
        fused = weights.fused(*matrices)
        assert len(weights.linears) - built == products
        alone = torch.cat([weights.matrix(name, shape)(x) for name, shape in matrices], dim=-1)
        assert torch.equal(fused(x), alone)
