"""Row-count-invariant attention and cache write: a row's bits ignore the rows beside it; both
paths within the bound."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import on_both_paths

from power.kernels import dispatch
from power.kernels.attention import BLOCK_N, attention_bound

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy

SLOTS, N_KV, CAPACITY = 2, 2, 256
ROWS = 17


def caches(head_k: int, head_v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(SLOTS, N_KV, CAPACITY, head_k, generator=generator),
            torch.randn(SLOTS, N_KV, CAPACITY, head_v, generator=generator))


def queries(group: int, head_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """17 rows in both slots at positions inside the first block, on block edges and across several blocks, and one
    padding row (slot -1)."""
    q = torch.randn(ROWS, N_KV * group, head_k, generator=torch.Generator().manual_seed(seed))
    positions = torch.tensor([0, 1, 5, BLOCK_N - 1, BLOCK_N, BLOCK_N + 1, 70, 71, 72, 95, 96, 130, 131, 3, 40, 0, 64])
    slots = torch.tensor([0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, -1, 1])
    return q, slots, positions


@pytest.mark.parametrize("window", [0, 40])
def test_a_rows_attention_is_the_same_bits_at_every_row_count(monkeypatch, window):
    k_cache, v_cache = caches(16, 16, seed=1)
    q, slots, positions = queries(3, 16, seed=2)
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)

        def attend(rows: slice) -> torch.Tensor:
            return dispatch.attention(q[rows].contiguous(), k_cache, v_cache, slots[rows].contiguous(),
                                      positions[rows].contiguous(), 0.25, window)

        full = attend(slice(0, ROWS))
        for rows in range(1, ROWS + 1):
            assert torch.equal(attend(slice(0, rows)), full[:rows]), (path, rows)
        for row in range(ROWS):
            assert torch.equal(attend(slice(row, row + 1)), full[row:row + 1]), (path, row)
        assert torch.equal(full[15], torch.zeros_like(full[15]))  # the padding row


@pytest.mark.parametrize(("group", "head_k", "head_v", "window"), [(3, 16, 16, 0), (1, 20, 12, 33), (4, 32, 24, 0)])
def test_both_paths_stay_within_the_stated_bound_of_exact_attention(monkeypatch, group, head_k, head_v, window):
    """Odd groups and head widths that are not powers of two (the kernel masks its tiles), global and windowed."""
    k_cache, v_cache = caches(head_k, head_v, seed=3)
    q, slots, positions = queries(group, head_k, seed=4)
    scale = head_k**-0.5
    exact, bound = attention_bound(q, k_cache, v_cache, slots, positions, scale, window)
    for out in on_both_paths(monkeypatch, dispatch.attention, q, k_cache, v_cache, slots, positions, scale, window):
        assert out.shape == (ROWS, N_KV * group * head_v) and out.dtype == torch.float32
        assert bool(((out.double() - exact).abs() <= bound).all())


def test_the_bound_is_tight_enough_to_catch_a_wrong_mask(monkeypatch):
    """The same rows read one cache row too many (a window one wider) fall outside the bound: it is no blanket."""
    k_cache, v_cache = caches(16, 16, seed=5)
    q, slots, positions = queries(2, 16, seed=6)
    exact, bound = attention_bound(q, k_cache, v_cache, slots, positions, 0.25, 20)
    monkeypatch.setenv("POWER_KERNELS", "triton")
    wider = dispatch.attention(q, k_cache, v_cache, slots, positions, 0.25, 21)
    outside = ((wider.double() - exact).abs() > bound).any(dim=1)
    assert bool(outside[positions >= 20].all())


def test_the_cache_write_stores_each_real_row_at_its_slot_and_position_and_padding_nowhere(monkeypatch):
    k_cache, v_cache = caches(16, 8, seed=7)
    generator = torch.Generator().manual_seed(8)
    k, v = torch.randn(4, N_KV, 16, generator=generator), torch.randn(4, N_KV, 8, generator=generator)
    slots, positions = torch.tensor([1, 0, -1, 1]), torch.tensor([9, 9, 3, 200])
    for path in ("triton", "reference"):
        monkeypatch.setenv("POWER_KERNELS", path)
        k_new, v_new = caches(16, 8, seed=7)
        dispatch.cache_write(k, v, k_new, v_new, slots, positions)
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        for row in (0, 1, 3):
            expected_k[slots[row], :, positions[row]] = k[row]
            expected_v[slots[row], :, positions[row]] = v[row]
        assert torch.equal(k_new, expected_k) and torch.equal(v_new, expected_v), path
