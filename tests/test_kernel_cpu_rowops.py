"""The trunks' per-row CPU kernels (power.kernels.cpu.rowops): RMS norm, rope and attention over a KV cache.

Each instruction path this CPU has is run and compared with the torch reference (the norm and the rope bit for
bit; the attention within a few ulps, its exp being the C library's) and with every other path (equal bits);
a row's result must be the same bits alone as among other rows, at every row count.
"""

from __future__ import annotations

import math

import pytest
import torch

from power.documents.kv_types import RUNTIME_KV_TYPES
from power.kernels.cpu import available_paths, rowops
from power.runtime import kv_rows

PATHS = available_paths()


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape, weight_shape", [((7, 640), (640,)), ((3, 5, 256), (5, 256)), ((2, 33), (33,))])
def test_rms_norm_is_its_reference_bit_for_bit(path: str, shape: tuple[int, ...],
                                               weight_shape: tuple[int, ...]) -> None:
    g = generator(1)
    x = torch.randn(shape, generator=g) * 3
    weight = torch.randn(weight_shape, generator=g)
    assert torch.equal(rowops.rms_norm(x, weight, 1e-6, path), rowops.reference_rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("neox", [True, False])
def test_rope_is_its_reference_bit_for_bit(path: str, neox: bool) -> None:
    g = generator(2)
    x = torch.randn(4, 6, 64, generator=g)
    angles = torch.rand(4, 32, generator=g) * 100
    assert torch.equal(rowops.rope(x, angles.cos(), angles.sin(), neox, path),
                       rowops.reference_rope(x, angles.cos(), angles.sin(), neox))


def cache(seed: int, kv_heads: int = 2, slots: int = 96, head_dim: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed)
    return torch.randn(kv_heads, slots, head_dim, generator=g), torch.randn(kv_heads, slots, head_dim, generator=g)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("heads, kv_heads, width, value_width", [
    (4, 2, 48, 48),  # query heads taken two at a time; value columns 32 + 16
    (4, 1, 64, 64),  # four at a time, as Gemma 3 270M
    (6, 2, 40, 40),  # three at a time; widths with a partial group of lanes
    (8, 1, 32, 24),  # four and four; values narrower than keys
    (6, 6, 16, 16),  # one query head a KV head
])
def test_attention_agrees_with_its_reference(path: str, window: int | None, heads: int, kv_heads: int, width: int,
                                             value_width: int) -> None:
    g = generator(3)
    k, v = torch.randn(kv_heads, 96, width, generator=g), torch.randn(kv_heads, 96, value_width, generator=g)
    q = torch.randn(6, heads, width, generator=generator(4))
    positions = torch.tensor([0, 1, 17, 40, 41, 95])
    got = rowops.attention(q, k, v, positions, window, 1 / math.sqrt(width), path)
    want = rowops.reference_attention(q, k, v, positions, window, 1 / math.sqrt(width))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", RUNTIME_KV_TYPES)
def test_attention_over_stored_rows_is_attention_over_the_values_they_hold(path: str, kv_type: str) -> None:
    """A cache held in f16, bf16 or q8_0 rows gives the same bits as the float32 cache of the values read back:
    reading a stored row is exact, and the arithmetic after it is the float32 kernel's."""
    k, v = cache(15, head_dim=64)
    k[..., :8] *= 1e-6  # f16 subnormals among the keys, which the kernels widen eight at a time where they can
    stored_k, stored_v = kv_rows.encode(k, kv_type), kv_rows.encode(v, kv_type)
    q = torch.randn(5, 4, 64, generator=generator(16))
    positions = torch.tensor([0, 9, 33, 60, 95])
    got = rowops.attention(q, stored_k, stored_v, positions, None, 0.125, path)
    held = rowops.attention(q, kv_rows.decode(stored_k, kv_type), kv_rows.decode(stored_v, kv_type), positions,
                            None, 0.125, path)
    assert torch.equal(got, held)
    if kv_type != "f32":  # the rounding is real: the values held are not the float32 ones
        assert not torch.equal(got, rowops.attention(q, k, v, positions, None, 0.125, path))


def test_attention_reads_only_the_slots_up_to_a_row_and_within_its_window() -> None:
    k, v = cache(5)
    q = torch.randn(1, 4, 48, generator=generator(6))
    position = torch.tensor([30])
    before = rowops.attention(q, k, v, position, 4, 0.1)
    k[:, 31:], v[:, 31:] = 1e3, 1e3  # later slots
    k[:, :27], v[:, :27] = -1e3, -1e3  # slots before the window of 4 (27, 28, 29, 30)
    assert torch.equal(rowops.attention(q, k, v, position, 4, 0.1), before)


def test_every_path_gives_the_same_bits() -> None:
    k, v = cache(7)
    q = torch.randn(9, 4, 48, generator=generator(8))
    positions = torch.arange(40, 49)
    x = torch.randn(9, 640, generator=generator(9))
    weight = torch.randn(640, generator=generator(10))
    results = {path: (rowops.attention(q, k, v, positions, 7, 0.2, path), rowops.rms_norm(x, weight, 1e-5, path))
               for path in PATHS}
    first = results[PATHS[0]]
    for path in PATHS[1:]:
        assert torch.equal(results[path][0], first[0]), path
        assert torch.equal(results[path][1], first[1]), path


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("positions, window", [
    (torch.arange(60, 77), None),
    # rows whose windows overlap in part or not at all, out of order, attended side by side
    (torch.tensor([90, 3, 50, 51, 0, 95, 20, 21, 22, 70, 7, 64, 65, 40, 41, 88, 12]), 6),
])
def test_a_row_is_the_same_bits_at_every_row_count(path: str, positions: torch.Tensor, window: int | None) -> None:
    k, v = cache(11)
    q = torch.randn(17, 4, 48, generator=generator(12))
    x = torch.randn(17, 640, generator=generator(13))
    weight = torch.randn(640, generator=generator(14))
    full_attention = rowops.attention(q, k, v, positions, window, 0.3, path)
    full_norm = rowops.rms_norm(x, weight, 1e-6, path)
    for rows in range(1, 18):
        assert torch.equal(rowops.attention(q[:rows], k, v, positions[:rows], window, 0.3, path),
                           full_attention[:rows])
        assert torch.equal(rowops.rms_norm(x[:rows], weight, 1e-6, path), full_norm[:rows])
    for row in range(17):
        alone = rowops.attention(q[row:row + 1], k, v, positions[row:row + 1], window, 0.3, path)
        assert torch.equal(alone, full_attention[row:row + 1])


def test_a_position_outside_the_cache_is_refused() -> None:
    k, v = cache(15, slots=8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        rowops.attention(torch.zeros(1, 4, 48), k, v, torch.tensor([8]), None, 1.0)


def test_training_gets_gradients_through_the_layers_norm_and_rope_whichever_operand_carries_them() -> None:
    from power.runtime.layers import apply_rope, rms_norm

    x = torch.randn(5, 16)
    weight = torch.randn(16, requires_grad=True)
    rms_norm(x, weight, 1e-6).sum().backward()
    expected = torch.nn.functional.rms_norm(x, (16,), None, 1e-6).sum(dim=0)
    assert weight.grad is not None and torch.allclose(weight.grad, expected, atol=1e-5)

    heads = torch.randn(5, 2, 8)
    angles = torch.randn(5, 4, requires_grad=True)
    apply_rope(heads, angles.cos(), angles.sin(), neox=True).sum().backward()
    assert angles.grad is not None and bool(angles.grad.abs().sum() > 0)
