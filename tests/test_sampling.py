"""Sampling: the counter-based stream, the warps, the one draw, and the rejection rule's distribution."""

from __future__ import annotations

import math

import pytest
import sampling_reference as reference
import torch

from power.kernels import dispatch
from power.runtime.sampling import Lane, Sampler, SamplingParams, target_probs, uniform


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
    uniforms = (0.0, 0.25, 0.5, 0.75, 1.0 - 2**-53)
    assert {int(dispatch.draw(probs, u)) for u in uniforms} == {1, 3}
    assert {reference.draw(probs, u) for u in uniforms} == {1, 3}


def test_the_runtime_draw_agrees_with_the_float64_reference():
    gen = torch.Generator().manual_seed(2)
    for vocab in (7, 1000):
        for trial in range(200):
            probs = torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 3, dim=0)
            u = uniform(trial, vocab)
            assert int(dispatch.draw(probs, u)) == reference.draw(probs, u)


def test_a_plain_token_and_a_bonus_token_take_the_same_draw():
    """Under `rejection`, a plain round's token and a speculative round's bonus token at the same position come
    from one draw, even for a uniform between a CDF boundary and that boundary rounded to the fixed-point grid."""
    params = SamplingParams(temperature=1.0, seed=21, verify="rejection")
    position = 3
    u = uniform(params.seed, position, Lane.SAMPLE)
    mass = u - 2**-30  # token 0's mass: just below the uniform, above the uniform rounded down to 2^-24
    assert math.floor(u * 2**24) / 2**24 < mass
    p = torch.tensor([mass, 1.0 - mass], dtype=torch.float64)
    plain = Sampler(params).sample(p.log(), position)

    certain = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # the one proposal (token 1) has p = q = 1: kept
    uniforms = torch.tensor([[uniform(params.seed, row, lane) for lane in Lane] for row in (position - 1, position)],
                            dtype=torch.float64)
    accepted, bonus = dispatch.rejection_step(torch.cat([certain, p[None]]), certain, torch.tensor([1]), uniforms)
    assert (int(accepted), int(bonus)) == (1, plain)
    assert reference.draw(p, u) != plain  # the case can tell two draws apart: float64 rounds it the other way


def test_seeded_sampling_converges_to_the_target_distribution():
    logits = torch.randn(8, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.8, seed=5)
    target = target_probs(logits, params)
    sampler = Sampler(params)
    tokens = [sampler.sample(logits, p) for p in range(20000)]
    assert _tv(_histogram(tokens, 8), target) < 0.02


def _rejection_round(seed: int, p, q, position: int, proposal_gen: torch.Generator) -> int:
    proposal = int(torch.multinomial(q, 1, generator=proposal_gen))
    if reference.accept(p, q, proposal, uniform(seed, position, Lane.ACCEPT)):
        return proposal
    return reference.correct(p, q, uniform(seed, position, Lane.RESIDUAL))


def test_rejection_rule_output_converges_to_the_target_distribution():
    """vLLM's method: the empirical output distribution approaches p as samples grow, whatever q is."""
    vocab = 10
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=1.0, seed=9, verify="rejection")
    p = target_probs(torch.randn(vocab, generator=gen) * 2, params)
    q = torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 2, dim=0)
    assert _tv(p, q) > 0.2  # the drafter is genuinely wrong

    proposal_gen = torch.Generator().manual_seed(4)
    distances = []
    tokens: list[int] = []
    for total in (100, 1000, 20000):
        tokens += [_rejection_round(params.seed, p, q, pos, proposal_gen) for pos in range(len(tokens), total)]
        distances.append(_tv(_histogram(tokens, vocab), p))
    assert distances[-1] < 0.02
    assert distances[-1] < distances[0]
    draft_only = _histogram([int(torch.multinomial(q, 1, generator=proposal_gen)) for _ in range(20000)], vocab)
    assert _tv(draft_only, p) > 10 * distances[-1]  # the check can tell q from p


def test_rejection_never_accepts_a_token_the_drafter_could_not_draw():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    for pos in range(100):
        uniforms = torch.tensor([[uniform(0, row, lane) for lane in Lane] for row in (pos, pos + 1)],
                                dtype=torch.float64)
        assert [int(t) for t in dispatch.rejection_step(p, q, torch.tensor([1]), uniforms)] == [0, 1]
    assert not any(reference.accept(p[0], q[0], 1, uniform(0, pos, Lane.ACCEPT)) for pos in range(100))
    assert all(reference.correct(p[0], q[0], uniform(0, pos, Lane.RESIDUAL)) == 1 for pos in range(100))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}, {"verify": "typical"}],
)
def test_invalid_parameters_are_rejected_with_the_field_named(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
