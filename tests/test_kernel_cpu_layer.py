"""A Gemma 3 layer as one CPU kernel call (power.kernels.cpu.layer) and the cache write it shares with every trunk.

The layer kernel runs the ops the Python layer runs, in its order, so the bundled Gemma 3 270M with its layers as
one call each must give the logits and cache rows of the same trunk run op by op, bit for bit, for every KV type:
prompts, one-row and several-row forwards, a rewind, and several slots in one forward. The cache write
(`rowops.cache_write`) must round every row exactly as `kv_rows.encode`, its reference, on every instruction path,
including the values where rounding decides: q8_0's halves, all-zero blocks, f16's overflow and subnormals.
"""

from __future__ import annotations

import pytest
import torch
from spec_helpers import GEMMA

from power.documents.kv_types import RUNTIME_KV_TYPES
from power.kernels.cpu import available_paths, rowops
from power.runtime import kv_rows
from power.runtime.gguf_weights import GGUFFile
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import Part

PATHS = available_paths()


def awkward_rows(width: int) -> torch.Tensor:
    """Rows [8, 2, width] where rounding decides: random rows of every scale, a q8_0 block whose scale is exactly 1
    with values on the halves (x.5 rounds away from zero), an all-zero block, f16's largest finite values and overflow,
    subnormals and signed zeros."""
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(8, 2, width, generator=g) * torch.logspace(-6, 4, 8)[:, None, None]
    halves = torch.arange(-16, 16, dtype=torch.float32) + 0.5
    rows[0, 0, :32] = torch.cat((halves[:31], torch.tensor([127.0])))  # d = 127 / 127 = 1: q = round(x) on halves
    rows[0, 1, :32] = 0.0
    rows[1, 0, :4] = torch.tensor([65504.0, 65520.0, -1e6, 1e-8])
    rows[1, 1, :4] = torch.tensor([0.0, -0.0, 1e-40, -1e-42])
    return rows


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", RUNTIME_KV_TYPES)
def test_the_cache_write_rounds_each_row_as_its_reference(path: str, kv_type: str) -> None:
    width, positions_held = 64, 16
    rows = awkward_rows(width)
    dtype = kv_rows.DTYPES[kv_type]
    caches = torch.zeros(3, 2, positions_held, kv_rows.stored_width(kv_type, width), dtype=dtype)
    slots = torch.tensor([2, 2, 0, 1, 0, 2, 1, 0])
    positions = torch.tensor([0, 5, 15, 3, 4, 9, 0, 7])
    rowops.cache_write(rows, caches, slots, positions, path)
    want = torch.zeros_like(caches)
    for i in range(rows.shape[0]):
        want[slots[i], :, positions[i]] = kv_rows.encode(rows[i], kv_type)
    assert torch.equal(caches.view(torch.uint8), want.view(torch.uint8))


def test_the_cache_write_refuses_a_row_outside_the_caches() -> None:
    caches = torch.zeros(1, 1, 4, 32)
    with pytest.raises(RuntimeError, match="outside the caches"):
        rowops.cache_write(torch.ones(1, 1, 32), caches, torch.tensor([0]), torch.tensor([4]))
    with pytest.raises(RuntimeError, match="outside the caches"):
        rowops.cache_write(torch.ones(1, 1, 32), caches, torch.tensor([-1]), torch.tensor([0]))


def gemma_pair(kv_type: str):
    gguf = GGUFFile(GEMMA)
    return [load_trunk(gguf, n_ctx=256, verify_capacity=8, slots=2, kv_type=kv_type, greedy_head=False,
                       layer_kernels=on) for on in (True, False)]


# Every KV type on this CPU's chosen path; every other instruction path with the q8_0 cache, whose write rounds most.
CASES = [(PATHS[0], kv_type) for kv_type in RUNTIME_KV_TYPES] + [(path, "q8_0") for path in PATHS[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("path, kv_type", CASES)
def test_a_gemma_layer_as_one_call_is_the_ops_bit_for_bit(path: str, kv_type: str, monkeypatch) -> None:
    monkeypatch.setenv("POWER_CPU_PATH", path)  # the products' path; the layer kernel takes theirs
    one_call, op_by_op = gemma_pair(kv_type)
    assert one_call.instruction_path == path
    assert all(layer.kernel is not None for layer in one_call.layers)
    assert all(layer.kernel is None for layer in op_by_op.layers)

    def both(run) -> None:
        got, want = run(one_call), run(op_by_op)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.logits, b.logits)
            assert all(torch.equal(a.hidden[layer], b.hidden[layer]) for layer in b.hidden)

    prompt = [2, *range(300, 340)]
    both(lambda t: [t.prefill(prompt, taps=[0, 9, 18], all_logits=True)])
    both(lambda t: [t.forward([5000])])
    both(lambda t: [t.forward([17, 2000, 9, 40, 41, 42, 43], taps=[6])])
    for trunk in (one_call, op_by_op):
        trunk.rewind(len(prompt) + 3)
    both(lambda t: [t.forward([8, 8])])
    both(lambda t: [t.prefill([2, 600, 601, 602], slot=1)])
    both(lambda t: t.forward_parts([Part(0, [70, 71, 72]), Part(1, [900])]))
    for a, b in zip(one_call.layers, op_by_op.layers, strict=True):
        assert torch.equal(a.caches.k.view(torch.uint8), b.caches.k.view(torch.uint8))
        assert torch.equal(a.caches.v.view(torch.uint8), b.caches.v.view(torch.uint8))
