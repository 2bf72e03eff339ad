"""Fused greedy verify: Triton (interpreted) and the torch reference agree with a planted-argmax oracle."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import ints, on_both_paths

from power.kernels import dispatch

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

GEMMA_VOCAB = 262_144


def planted(k: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random logits [K+1, V] whose row i has its unique maximum at targets[i]."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=gen)
    targets = torch.randint(0, vocab, (k + 1,), generator=gen)
    logits[torch.arange(k + 1), targets] = 10.0
    return logits.to(dtype), targets


@pytest.mark.parametrize(
    ("k", "vocab"),
    [(0, 5), (1, 1000), (7, 4097), (16, 4099), (16, 33), (2, GEMMA_VOCAB)],
)
@pytest.mark.parametrize("mismatch", ["none", "first", "middle"])
def test_accepted_prefix_and_next_token_match_the_oracle(monkeypatch, k, vocab, mismatch):
    logits, targets = planted(k, vocab, seed=k * 7 + vocab)
    proposals = targets[:k].clone()
    stop = {"none": k, "first": 0, "middle": k // 2}[mismatch] if k else 0
    if stop < k:
        proposals[stop] = (proposals[stop] + 1) % vocab
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.greedy_verify, logits, proposals)
    assert ints(triton_out) == ints(reference_out) == [stop, int(targets[stop])]


def test_fp16_logits_agree(monkeypatch):
    logits, targets = planted(5, 3001, seed=3, dtype=torch.float16)
    proposals = targets[:5].clone()
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.greedy_verify, logits, proposals)
    assert ints(triton_out) == ints(reference_out) == [5, int(targets[5])]


def test_ties_resolve_to_the_lowest_token_id_across_chunks(monkeypatch):
    logits = torch.zeros(3, 9000)
    logits[0, [8000, 4100]] = 1.0  # equal maxima in different chunks
    logits[1] = float("-inf")  # a row with no finite entry
    proposals = torch.tensor([4100, 0])
    triton_out, reference_out = on_both_paths(monkeypatch, dispatch.greedy_verify, logits, proposals)
    assert ints(triton_out) == ints(reference_out) == [2, 0]


def test_results_are_int64_scalars_on_the_logits_device(monkeypatch):
    logits, targets = planted(3, 100, seed=1)
    for out in on_both_paths(monkeypatch, dispatch.greedy_verify, logits, targets[:3].to(torch.int32)):
        assert all(t.shape == () and t.dtype == torch.int64 and t.device == logits.device for t in out)
