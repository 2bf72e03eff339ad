"""Packed weights (`power.runtime.linear`): row independence, the quantised arithmetics, and what each costs in error."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import random_blocks

from power.documents.arithmetic import FLOAT32, QUANTISED
from power.kernels.dequant import dequantize_reference
from power.runtime.errors import RuntimeInputError
from power.runtime.linear import ACTIVATION_MAX, LOW_LEVEL, BlockLinear, Int8Linear, Stacked, pack, pack_head

OUT, IN, ROWS = 300, 160, 8


def weights(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(OUT, IN, generator=generator) * torch.rand(OUT, 1, generator=generator)  # rows of unlike scale


def activations(rows: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(seed))
    x[:, 7] *= 40  # an outlier channel, as in real hidden states
    return x


@pytest.mark.parametrize("make", [lambda w: pack(w, FLOAT32, ROWS), lambda w: pack(w, FLOAT32, 1),
                                  lambda w: pack(w, QUANTISED, ROWS), lambda w: pack_head(w, QUANTISED, ROWS)],
                         ids=["float32", "float32-one-row", "int8", "int8-head"])
def test_a_rows_result_ignores_the_rows_beside_it(make):
    linear = make(weights())
    x = activations(ROWS, seed=1)
    together = linear(x)
    for j in range(ROWS):
        neighbours = activations(ROWS, seed=100 + j)
        neighbours[j] = x[j]
        assert torch.equal(linear(neighbours)[j], together[j]), f"row {j} changed with its neighbours"


@pytest.mark.parametrize(("make", "bound"), [(lambda w: pack(w, FLOAT32, ROWS), 1e-5),
                                             (lambda w: pack(w, QUANTISED, ROWS), 2e-2),
                                             # one activation level: its step is 1/ACTIVATION_MAX of the row's max
                                             (lambda w: pack_head(w, QUANTISED, ROWS), 6e-2 * 127 / ACTIVATION_MAX)],
                         ids=["float32", "int8", "int8-head"])
def test_each_dtype_stays_within_its_error_relative_to_the_exact_product(make, bound):
    w, x = weights(), activations(ROWS, seed=2)
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T  # the size of the sum each result is a part of
    error = ((make(w)(x).double() - exact).abs() / scale).max().item()
    assert error < bound


@pytest.mark.parametrize("make", [lambda w: pack(w, QUANTISED, ROWS), lambda w: pack_head(w, QUANTISED, ROWS)],
                         ids=["int8", "int8-head"])
def test_int8_rows_are_the_same_bits_at_any_row_count(make):
    linear = make(weights())
    x = activations(17, seed=5)
    full = linear(x)
    assert linear.row_count_invariant
    for rows in range(1, 17):
        assert torch.equal(linear(x[:rows]), full[:rows]), f"{rows} rows differ from the same rows among 17"


def test_int8_is_integer_products_of_the_requantised_rows_and_two_activation_levels():
    w, x = weights(), activations(ROWS, seed=3)
    w_scale = w.abs().amax(dim=1) / 127
    q = torch.round(w / w_scale[:, None])
    step = x.abs().amax(dim=1, keepdim=True) / ACTIVATION_MAX
    high = torch.round(x / step)
    low = torch.round((x / step - high) * LOW_LEVEL)
    expected = (high.double() @ q.double().T + low.double() @ q.double().T / LOW_LEVEL) * w_scale.double() * step.double()
    torch.testing.assert_close(pack(w, QUANTISED, ROWS)(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_one_level_drops_the_residual_level():
    w, x = weights(), activations(ROWS, seed=4)
    w_scale = w.abs().amax(dim=1) / 127
    step = x.abs().amax(dim=1, keepdim=True) / ACTIVATION_MAX
    expected = (torch.round(x / step).double() @ torch.round(w / w_scale[:, None]).double().T
                * w_scale.double() * step.double())
    torch.testing.assert_close(pack_head(w, QUANTISED, ROWS)(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_zero_rows_give_zero_results():
    assert torch.equal(pack(weights(), QUANTISED, ROWS)(torch.zeros(ROWS, IN)), torch.zeros(ROWS, OUT))


def test_int8_off_the_cpu_fails_closed_instead_of_falling_back():
    with pytest.raises(RuntimeInputError, match="int8 weights run on the CPU"):
        Int8Linear(torch.empty(OUT, IN, device="meta"), ROWS)


def test_nbytes_is_what_a_call_reads():
    w = weights()
    assert pack(w, FLOAT32, ROWS).nbytes == OUT * IN * 4
    assert pack(w, QUANTISED, ROWS).nbytes == OUT * IN + OUT * 4


def test_each_packing_names_the_instruction_path_its_products_take():
    assert pack(weights(), FLOAT32, ROWS).path == "torch-float32"
    assert pack(weights(), QUANTISED, ROWS).path.startswith("onednn-u8s8-")


def gguf_rows(qtype: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A [OUT, 256] matrix as random GGUF rows of `qtype`, and its exact dequantisation."""
    raw = random_blocks(qtype, OUT, 256, seed)
    return raw, dequantize_reference(qtype, raw.reshape(-1), (OUT, 256))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_gguf_rows_multiply_in_place_at_any_row_count(qtype):
    """The GPU's quantised packing: the file's rows and the batch-invariant product (its reference on the CPU)."""
    raw, exact = gguf_rows(qtype)
    linear = BlockLinear(raw, qtype, (OUT, 256))
    x = torch.randn(17, 256, generator=torch.Generator().manual_seed(3))
    full = linear(x)
    assert linear.row_count_invariant and linear.nbytes == raw.numel()
    torch.testing.assert_close(full, x @ exact.T, rtol=1e-5, atol=1e-4)
    for rows in range(1, 17):
        assert torch.equal(linear(x[:rows]), full[:rows]), f"{rows} rows differ from the same rows among 17"


def test_matrices_of_different_types_stack_side_by_side():
    (q4, exact4), (q8, exact8) = gguf_rows("Q4_K", 1), gguf_rows("Q8_0", 2)
    stacked = Stacked([BlockLinear(q4, "Q4_K", (OUT, 256)), BlockLinear(q8, "Q8_0", (OUT, 256))])
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4))
    assert stacked.shape == (2 * OUT, 256) and stacked.nbytes == q4.numel() + q8.numel()
    assert stacked.row_count_invariant
    torch.testing.assert_close(stacked(x), x @ torch.cat((exact4, exact8)).T, rtol=1e-5, atol=1e-4)
