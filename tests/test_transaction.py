"""The exactness transaction, driven path by path with the oracle speculator on real trunks."""

from __future__ import annotations

import pytest
from spec_helpers import oracle_for, plain_stream, prompt_for, speculative, trunk

from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.speculators.chain import ChainSpeculator
from power.runtime.transaction import SpeculativeSequence

N = 64


def _sequence(model: str, plan, stop_ids=(), s: int = 10, **params) -> tuple[SpeculativeSequence, list[int]]:
    oracle = oracle_for(model, N, plan)
    seq = SpeculativeSequence(trunk(model, s), Sampler(SamplingParams(**params)), oracle, stop_ids)
    seq.start(prompt_for(model))
    return seq, list(plain_stream(model, N))


def _committed_invariant(seq: SpeculativeSequence) -> None:
    """The target holds every committed token except the anchor."""
    assert seq.trunk.position == len(seq.tokens) - 1


def test_full_acceptance_emits_every_proposal_and_a_bonus():
    seq, truth = _sequence("dense", [None])
    result = seq.round(7)
    assert (result.proposed, result.accepted, result.replayed) == (7, 7, False)
    assert seq.emitted == truth[:9]
    _committed_invariant(seq)


@pytest.mark.parametrize("correct", [0, 1, 4, 6])
def test_partial_and_zero_acceptance_emit_the_prefix_and_one_correction(correct):
    seq, truth = _sequence("dense", [correct])
    result = seq.round(7)
    assert result.accepted == correct
    assert result.emitted == truth[1 : correct + 2]  # the accepted prefix, then the target's own token
    _committed_invariant(seq)


def test_the_autoregressive_path_is_a_zero_proposal_round():
    seq, truth = _sequence("dense", [])
    result = seq.round(0)
    assert (result.proposed, result.member, result.emitted) == (0, None, [truth[1]])
    _committed_invariant(seq)


def test_a_chain_round_names_the_member_it_paid_for_and_skips_a_parked_one():
    """The governor's per-member accounting: the round belongs to the member that proposed; a parked member
    (False in `members`) is never asked; a round where nothing was proposed and no head ran is a plain one."""
    ahead, behind = oracle_for("dense", N, [None] * 4), oracle_for("dense", N, [None] * 4)
    seq = SpeculativeSequence(trunk("dense", 10), Sampler(SamplingParams()), ChainSpeculator([ahead, behind]))
    seq.start(prompt_for("dense"))
    opened = seq.open_round(3)
    assert (opened.member, len(ahead.asked), len(behind.asked)) == (0, 1, 0)
    seq.abort_round(opened)
    opened = seq.open_round(3, members=(False, True))
    assert (opened.member, len(ahead.asked), len(behind.asked)) == (1, 0, 1)  # the abort restored the first ask
    seq.abort_round(opened)
    ahead.truth = behind.truth = []  # neither has a continuation to propose
    opened = seq.open_round(3)
    assert (opened.member, opened.drafts, len(ahead.asked), len(behind.asked)) == (None, [], 1, 1)
    seq.abort_round(opened)


def test_the_counters_hold_each_draft_positions_acceptance_given_it_was_reached():
    """Rounds that accept 4 of 4, 2 of 4, then 0 of 1 (11 tokens leave room for one draft; the last token is a
    plain step): position 1 was reached 3 times and accepted twice, position 3 reached twice and accepted once."""
    generation = speculative("dense", oracle_for("dense", N, [None, 2, 0]), k=4, s=10).generate(prompt_for("dense"), 11)
    stats = generation.stats
    assert (stats.position_reached, stats.position_accepted) == ([3, 2, 2, 1], [2, 2, 1, 1])
    assert stats.acceptance_by_position == pytest.approx([2 / 3, 1.0, 0.5, 1.0])
    assert stats.to_json()["acceptance_by_position"] == stats.acceptance_by_position


def test_an_accepted_stop_token_ends_the_round_and_nothing_after_it_is_kept():
    seq, truth = _sequence("dense", [None])
    stop = truth[3]
    seq.stop_ids = frozenset({stop})
    result = seq.round(7)
    assert result.emitted[-1] == stop and seq.emitted == truth[: truth.index(stop) + 1]
    _committed_invariant(seq)


def test_greedy_rejection_rule_equals_the_match_rule():
    seq, truth = _sequence("dense", [3, None, 0], verify="rejection")
    for _ in range(3):
        seq.round(5)
    assert seq.emitted == truth[: len(seq.emitted)]
    _committed_invariant(seq)


def test_attention_only_trunks_rewind_any_suffix_without_replay():
    generation = speculative("dense", oracle_for("dense", N, then=0), k=10, s=1).generate(prompt_for("dense"), N)
    assert generation.stats.replays == 0 and generation.stats.clamps == 0
    assert tuple(generation.tokens) == plain_stream("dense", N)


def test_adaptive_controller_opens_the_wide_shape_after_a_fully_accepted_first_round():
    oracle = oracle_for("dense", N, plan=[None], then=None)
    speculative("dense", oracle, k=7, s=3, adaptive=True).generate(prompt_for("dense"), N)
    assert oracle.asked[0] == 3 and set(oracle.asked[1:-1]) == {7}


def test_adaptive_controller_closes_the_wide_shape_after_a_partial_first_round():
    oracle = oracle_for("dense", N, plan=[1], then=None)
    generation = speculative("dense", oracle, k=7, s=3, adaptive=True).generate(prompt_for("dense"), N)
    assert max(oracle.asked) == 3
    assert tuple(generation.tokens) == plain_stream("dense", N)


def test_adaptive_controller_falls_back_one_way_after_consecutive_low_yield():
    oracle = oracle_for("dense", N, plan=[None, None, 0, 0, 0], then=None)
    generation = speculative("dense", oracle, k=4, s=4, adaptive=True).generate(prompt_for("dense"), N)
    assert len(oracle.asked) == 5  # no proposal was asked for after the fallback, though the oracle would be right
    assert generation.stats.fallbacks == 1
    assert tuple(generation.tokens) == plain_stream("dense", N)


def test_a_rejection_beyond_the_resident_window_replays_once_then_clamps_to_s():
    oracle = oracle_for("hybrid", N, plan=[None, 0], then=None)
    generation = speculative("hybrid", oracle, k=7, s=2).generate(prompt_for("hybrid"), N)
    assert oracle.asked[:2] == [7, 7]  # round 2 rejects all 7: a suffix of 7 > S = 2 rows
    assert set(oracle.asked[2:-1]) == {2}  # every later round of the request is clamped to S
    assert (generation.stats.replays, generation.stats.clamps) == (1, 1)
    assert tuple(generation.tokens) == plain_stream("hybrid", N)


def test_a_rejection_inside_the_resident_window_needs_no_replay():
    oracle = oracle_for("hybrid", N, plan=[5], then=None)
    generation = speculative("hybrid", oracle, k=7, s=2).generate(prompt_for("hybrid"), N)
    assert (generation.stats.replays, generation.stats.clamps) == (0, 0)
    assert set(oracle.asked[:-1]) == {7}
    assert tuple(generation.tokens) == plain_stream("hybrid", N)
