"""GGUF dequantisation: Triton (interpreted), the torch reference and gguf.quants agree to the bit."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from kernel_helpers import on_both_paths, random_blocks

from power.kernels import dispatch
from power.kernels.dequant import BLOCK_LAYOUT, TRITON_TYPES
from power.runtime.gguf_weights import GGUFFile

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

GEMMA = Path(__file__).resolve().parents[1] / "models" / "gemma-3-270m-q4_k_m.gguf"


def bits(values: torch.Tensor | np.ndarray) -> np.ndarray:
    """Compare floats by their bit patterns (catches -0.0 vs 0.0 and any rounding difference)."""
    array = values.numpy() if isinstance(values, torch.Tensor) else values
    return np.ascontiguousarray(array, dtype=np.float32).view(np.int32)


@pytest.mark.parametrize("qtype", sorted(TRITON_TYPES))
def test_random_blocks_match_gguf_quants_bit_for_bit(monkeypatch, qtype):
    per_block, _ = BLOCK_LAYOUT[qtype]
    rows, cols = 7, per_block * 3
    raw = random_blocks(qtype, rows, cols, seed=len(qtype))
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.dequantize, qtype, raw.reshape(-1), (rows, cols))
    expected = gguf_dequantize(raw.numpy(), gguf.GGMLQuantizationType[qtype])
    assert triton_out.shape == reference_out.shape == (rows, cols)
    assert np.array_equal(bits(triton_out), bits(expected))
    assert np.array_equal(bits(reference_out), bits(expected))


def test_real_gemma_rows_match_gguf_quants(monkeypatch):
    """The first 48 rows of one tensor of every quantised type in the real Gemma 3 270M file."""
    gemma = GGUFFile(GEMMA)
    first_of_type: dict[str, str] = {}
    for info in gemma.tensors.values():
        first_of_type.setdefault(info.qtype, info.name)
    quantised = {qtype: name for qtype, name in first_of_type.items() if qtype in TRITON_TYPES}
    assert set(quantised) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    for qtype, name in quantised.items():
        info = gemma.info(name)
        rows, cols = 48, info.shape[-1]
        raw = gemma.raw(name)[: rows * info.nbytes // info.shape[0]]
        triton_out, reference_out = on_both_paths(monkeypatch, dispatch.dequantize, qtype, raw, (rows, cols))
        expected = gguf_dequantize(raw.numpy().reshape(rows, -1), gguf.GGMLQuantizationType[qtype])
        assert np.array_equal(bits(triton_out), bits(expected)), name
        assert np.array_equal(bits(reference_out), bits(expected)), name


@pytest.mark.parametrize(("qtype", "dtype"), [("F32", np.float32), ("F16", np.float16)])
def test_float_types_pass_through_the_reference(monkeypatch, qtype, dtype):
    values = np.random.default_rng(1).standard_normal((3, 5)).astype(dtype)
    raw = torch.from_numpy(values.reshape(-1).view(np.uint8).copy())
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.dequantize, qtype, raw, (3, 5))
    assert np.array_equal(bits(triton_out), bits(values.astype(np.float32)))
    assert np.array_equal(bits(reference_out), bits(values.astype(np.float32)))
