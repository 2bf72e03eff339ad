"""The plan's KV cache type in Power's runtime: rows rounded on write, read back exactly, charged as held.

Each cache row is rounded to the type by itself (`power.runtime.kv_rows`), so a row's bits never depend on the forward
that wrote it: rows stay the same bits at every row count and beside other sequences, and greedy speculation stays
equal to plain decoding, with every type. A q8_0 row is llama.cpp's `block_q8_0`, byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from power.documents.kv_types import RUNTIME_KV_TYPES, row_bytes
from power.runtime import kv_rows


def rows(seed: int, shape: tuple[int, ...] = (3, 5, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4


def test_a_q8_0_row_is_llama_cpps_block_q8_0_byte_for_byte():
    x = rows(1)
    x[0, 0, :32] = 0  # an all-zero block: scale 0, values 0
    stored = kv_rows.encode(x, "q8_0")
    expected = quants.quantize(x.numpy().reshape(-1, 64), GGMLQuantizationType.Q8_0)
    assert np.array_equal(stored.reshape(-1, stored.shape[-1]).numpy(), expected)
    held = quants.dequantize(expected, GGMLQuantizationType.Q8_0)
    assert np.array_equal(kv_rows.decode(stored, "q8_0").reshape(-1, 64).numpy(), held)


@pytest.mark.parametrize("kv_type", RUNTIME_KV_TYPES)
def test_a_stored_row_costs_its_row_bytes_and_reads_back_what_it_rounded_to(kv_type):
    x = rows(2)
    stored = kv_rows.encode(x, kv_type)
    assert stored.shape[-1] * stored.element_size() == row_bytes(kv_type, 64)
    held = kv_rows.decode(stored, kv_type)
    assert held.dtype == torch.float32
    assert torch.equal(kv_rows.decode(kv_rows.encode(held, kv_type), kv_type), held)  # rounding is idempotent
    if kv_type in ("f16", "bf16"):
        assert torch.equal(held, x.to(kv_rows.DTYPES[kv_type]).float())


@pytest.mark.parametrize("kv_type", RUNTIME_KV_TYPES)
def test_a_row_rounds_the_same_alone_and_among_other_rows(kv_type):
    x = rows(3, (17, 2, 64))
    together = kv_rows.encode(x, kv_type)
    for i in range(x.shape[0]):
        assert torch.equal(kv_rows.encode(x[i:i + 1], kv_type), together[i:i + 1])
