"""FR prefix projection + argmax: only the first N vocabulary rows are scored; both paths agree."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import on_both_paths

from power.kernels import dispatch

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

GEMMA_VOCAB = 262_144


def integer_valued(rows: int, vocab: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Small integers as floats: every score is exact in any summation order, and ties are common."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randint(-3, 4, (rows, width), generator=gen).float()
    head = torch.randint(-3, 4, (vocab, width), generator=gen).float()
    return hidden, head


def exact_argmax(hidden: torch.Tensor, head: torch.Tensor, n_prefix: int) -> torch.Tensor:
    return (hidden.double() @ head[:n_prefix].double().T).argmax(dim=-1)


@pytest.mark.parametrize(
    ("rows", "vocab", "width", "n_prefix"),
    [
        (1, 5, 3, 5),
        (3, 1001, 40, 999),
        (17, 4099, 24, 4097),
        (2, GEMMA_VOCAB, 8, 8192),
        (2, GEMMA_VOCAB, 8, GEMMA_VOCAB),
    ],
)
def test_integer_scores_pick_the_exact_argmax_lowest_id_first(monkeypatch, rows, vocab, width, n_prefix):
    hidden, head = integer_valued(rows, vocab, width, seed=vocab + n_prefix)
    triton_ids, reference_ids = on_both_paths(monkeypatch, dispatch.fr_argmax, hidden, head, n_prefix)
    assert torch.equal(triton_ids, reference_ids)
    assert torch.equal(triton_ids, exact_argmax(hidden, head, n_prefix))
    assert triton_ids.dtype == torch.int64 and triton_ids.shape == (rows,)


def test_rows_past_the_prefix_are_never_chosen(monkeypatch):
    hidden, head = integer_valued(2, 3000, 16, seed=1)
    head[2500:] = hidden.sum(dim=0) * 100  # every row past the prefix outscores the prefix
    triton_ids, reference_ids = on_both_paths(monkeypatch, dispatch.fr_argmax, hidden, head, 2500)
    assert torch.equal(triton_ids, reference_ids)
    assert bool((triton_ids < 2500).all())
    assert torch.equal(triton_ids, exact_argmax(hidden, head, 2500))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_heads_choose_a_best_scoring_row(monkeypatch, dtype):
    """Float scores: both paths pick a row whose exact score is within fp32 rounding of the best."""
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(4, 72, generator=gen).to(dtype)
    head = torch.randn(2053, 72, generator=gen).to(dtype)
    exact = hidden.double() @ head[:2049].double().T
    best = exact.max(dim=-1).values
    tolerance = 72 * 2.0**-23 * (hidden.double().abs() @ head[:2049].double().abs().T).max(dim=-1).values
    for ids in on_both_paths(monkeypatch, dispatch.fr_argmax, hidden, head, 2049):
        chosen = exact.gather(1, ids[:, None]).squeeze(1)
        assert bool(((best - chosen) <= tolerance).all())
