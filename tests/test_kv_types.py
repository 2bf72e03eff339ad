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


@pytest.mark.parametrize("kv_type", ["f16", "bf16"])
def test_the_gpu_paths_kernels_write_and_read_half_caches_as_the_values_they_hold(monkeypatch, kv_type):
    """The GPU path's cache write rounds each row to the cache's type (as torch's copy does) and its attention reads
    the rows back exactly: the same bits as over a float32 cache of the rounded values, Triton (interpreted here) and
    the torch reference alike."""
    from kernel_helpers import on_both_paths

    from power.kernels import dispatch

    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(6, 2, 32, generator=g), torch.randn(6, 2, 32, generator=g)
    q = torch.randn(6, 4, 32, generator=g)
    slots, positions = torch.tensor([0, 0, 0, 1, 1, -1]), torch.tensor([0, 1, 2, 0, 1, 0])
    dtype = kv_rows.DTYPES[kv_type]

    def written_and_read(cache_dtype, k_rows, v_rows):
        k_cache, v_cache = torch.zeros(2, 2, 64, 32, dtype=cache_dtype), torch.zeros(2, 2, 64, 32, dtype=cache_dtype)
        dispatch.cache_write(k_rows, v_rows, k_cache, v_cache, slots, positions)
        return k_cache, dispatch.attention(q, k_cache, v_cache, slots, positions, 0.2)

    for (k_cache, out), (_, held) in zip(on_both_paths(monkeypatch, written_and_read, dtype, k, v),
                                         on_both_paths(monkeypatch, written_and_read, torch.float32,
                                                       k.to(dtype).float(), v.to(dtype).float()), strict=True):
        assert torch.equal(k_cache[0, :, :3], k[:3].to(dtype).transpose(0, 1))
        assert torch.equal(out, held)


def test_q8_0_on_the_gpu_path_is_refused_not_downgraded():
    from gguf_helpers import fixtures

    from power.runtime.errors import RuntimeInputError
    from power.runtime.trunks import load_trunk

    with pytest.raises(RuntimeInputError) as refused:
        load_trunk(fixtures()["gemma3-target"], n_ctx=32, verify_capacity=2, kernel_path="gpu", kv_type="q8_0")
    assert refused.value.finding.code == "PWR514"
