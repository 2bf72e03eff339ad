"""Sampling: the counter-based stream, the warps, and the two verification rules' distributions."""

from __future__ import annotations

import pytest
import torch

from power.runtime.sampling import Lane, Sampler, SamplingParams, draw, target_probs, uniform


def _histogram(tokens: list[int], vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab).to(torch.float64)
    return counts / counts.sum()


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def test_uniform_is_a_pure_function_of_seed_position_and_lane():
    assert uniform(7, 42) == uniform(7, 42)
    assert uniform(7, 42) != uniform(8, 42)
    assert uniform(7, 42) != uniform(7, 43)
    assert uniform(7, 42, Lane.SAMPLE) != uniform(7, 42, Lane.ACCEPT)
    draws = torch.tensor([uniform(3, i) for i in range(20000)])
    assert 0.0 <= float(draws.min()) and float(draws.max()) < 1.0
    assert abs(float(draws.mean()) - 0.5) < 0.01
    deciles = torch.histc(draws, bins=10, min=0.0, max=1.0) / len(draws)
    assert float((deciles - 0.1).abs().max()) < 0.01


def test_greedy_is_the_argmax_with_ties_to_the_lowest_id():
    sampler = Sampler(SamplingParams())
    assert sampler.sample(torch.tensor([0.1, 3.0, -1.0, 3.0]), position=5) == 1
    probs = target_probs(torch.tensor([0.1, 3.0, -1.0, 3.0]), SamplingParams())
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_seeded_draws_depend_on_position_not_on_call_order():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11))
    forward = [sampler.sample(logits, p) for p in range(40)]
    backward = [sampler.sample(logits, p) for p in reversed(range(40))][::-1]
    assert forward == backward
    other_seed = [Sampler(SamplingParams(temperature=1.0, seed=12)).sample(logits, p) for p in range(40)]
    assert forward != other_seed


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    top2 = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top2[2:] == 0).all() and abs(float(top2.sum()) - 1.0) < 1e-12
    nucleus = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    full = torch.softmax(logits.double(), dim=0)
    assert float(full[0]) < 0.7 < float(full[0] + full[1])  # so the nucleus is exactly tokens 0 and 1
    assert nucleus.nonzero().flatten().tolist() == [0, 1]
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=1))
    assert {sampler.sample(logits, p) for p in range(500)} == {0, 1}


def test_draw_never_lands_on_a_zero_mass_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0], dtype=torch.float64)
    assert {draw(probs, u) for u in (0.0, 0.25, 0.5, 0.75, 1.0 - 2**-53)} == {1, 3}


def test_seeded_sampling_converges_to_the_target_distribution():
    logits = torch.randn(8, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.8, seed=5)
    target = target_probs(logits, params)
    sampler = Sampler(params)
    tokens = [sampler.sample(logits, p) for p in range(20000)]
    assert _tv(_histogram(tokens, 8), target) < 0.02


def _rejection_round(sampler: Sampler, p, q, position: int, proposal_gen: torch.Generator) -> int:
    proposal = int(torch.multinomial(q, 1, generator=proposal_gen))
    if sampler.accept(p, q, proposal, position):
        return proposal
    return sampler.correct(p, q, position)


def test_rejection_rule_output_converges_to_the_target_distribution():
    """vLLM's method: the empirical output distribution approaches p as samples grow, whatever q is."""
    vocab = 10
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=1.0, seed=9, verify="rejection")
    sampler = Sampler(params)
    p = target_probs(torch.randn(vocab, generator=gen) * 2, params)
    q = torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 2, dim=0)
    assert _tv(p, q) > 0.2  # the drafter is genuinely wrong

    proposal_gen = torch.Generator().manual_seed(4)
    distances = []
    tokens: list[int] = []
    for total in (100, 1000, 20000):
        tokens += [_rejection_round(sampler, p, q, pos, proposal_gen) for pos in range(len(tokens), total)]
        distances.append(_tv(_histogram(tokens, vocab), p))
    assert distances[-1] < 0.02
    assert distances[-1] < distances[0]
    draft_only = _histogram([int(torch.multinomial(q, 1, generator=proposal_gen)) for _ in range(20000)], vocab)
    assert _tv(draft_only, p) > 10 * distances[-1]  # the check can tell q from p


def test_rejection_never_accepts_a_token_the_drafter_could_not_draw():
    sampler = Sampler(SamplingParams(temperature=1.0, verify="rejection"))
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert not any(sampler.accept(p, q, 1, pos) for pos in range(100))
    assert all(sampler.correct(p, q, pos) == 1 for pos in range(100))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}, {"verify": "typical"}],
)
def test_invalid_parameters_are_rejected_with_the_field_named(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
