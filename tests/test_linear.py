"""Packed weights (`power.runtime.linear`): row independence, the int8 arithmetic, and what each dtype costs in error."""

from __future__ import annotations

import pytest
import torch

from power.documents.dtypes import WEIGHT_DTYPES
from power.runtime.errors import RuntimeInputError
from power.runtime.linear import ACTIVATION_MAX, KINDS, LOW_LEVEL, Int8Linear, pack, pack_head

OUT, IN, ROWS = 300, 160, 8


def weights(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(OUT, IN, generator=generator) * torch.rand(OUT, 1, generator=generator)  # rows of unlike scale


def activations(rows: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(seed))
    x[:, 7] *= 40  # an outlier channel, as in real hidden states
    return x


def test_every_offered_dtype_has_a_packing():
    assert tuple(KINDS) == WEIGHT_DTYPES


@pytest.mark.parametrize("make", [lambda w: pack(w, "float32", ROWS), lambda w: pack(w, "float32", 1),
                                  lambda w: pack(w, "bfloat16", ROWS), lambda w: pack(w, "int8", ROWS),
                                  lambda w: pack_head(w, "int8", ROWS)],
                         ids=["float32", "float32-one-row", "bfloat16", "int8", "int8-head"])
def test_a_rows_result_ignores_the_rows_beside_it(make):
    linear = make(weights())
    x = activations(ROWS, seed=1)
    together = linear(x)
    for j in range(ROWS):
        neighbours = activations(ROWS, seed=100 + j)
        neighbours[j] = x[j]
        assert torch.equal(linear(neighbours)[j], together[j]), f"row {j} changed with its neighbours"


@pytest.mark.parametrize(("make", "bound"), [(lambda w: pack(w, "float32", ROWS), 1e-5),
                                             (lambda w: pack(w, "bfloat16", ROWS), 2e-2),
                                             (lambda w: pack(w, "int8", ROWS), 2e-2),
                                             # one activation level: its step is 1/ACTIVATION_MAX of the row's max
                                             (lambda w: pack_head(w, "int8", ROWS), 6e-2 * 127 / ACTIVATION_MAX)],
                         ids=["float32", "bfloat16", "int8", "int8-head"])
def test_each_dtype_stays_within_its_error_relative_to_the_exact_product(make, bound):
    w, x = weights(), activations(ROWS, seed=2)
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T  # the size of the sum each result is a part of
    error = ((make(w)(x).double() - exact).abs() / scale).max().item()
    assert error < bound


@pytest.mark.parametrize("make", [lambda w: pack(w, "int8", ROWS), lambda w: pack_head(w, "int8", ROWS)],
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
    torch.testing.assert_close(pack(w, "int8", ROWS)(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_one_level_drops_the_residual_level():
    w, x = weights(), activations(ROWS, seed=4)
    w_scale = w.abs().amax(dim=1) / 127
    step = x.abs().amax(dim=1, keepdim=True) / ACTIVATION_MAX
    expected = (torch.round(x / step).double() @ torch.round(w / w_scale[:, None]).double().T
                * w_scale.double() * step.double())
    torch.testing.assert_close(pack_head(w, "int8", ROWS)(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_zero_rows_give_zero_results():
    assert torch.equal(pack(weights(), "int8", ROWS)(torch.zeros(ROWS, IN)), torch.zeros(ROWS, OUT))


def test_int8_off_the_cpu_fails_closed_instead_of_falling_back():
    with pytest.raises(RuntimeInputError, match="int8 weights run on the CPU"):
        Int8Linear(torch.empty(OUT, IN, device="meta"), ROWS)


def test_nbytes_is_what_a_call_reads():
    w = weights()
    assert pack(w, "float32", ROWS).nbytes == OUT * IN * 4
    assert pack(w, "bfloat16", ROWS).nbytes == OUT * IN * 2
    assert pack(w, "int8", ROWS).nbytes == OUT * IN + OUT * 4
