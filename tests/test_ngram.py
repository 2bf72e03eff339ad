"""The n-gram speculator: what it proposes, that its incremental index equals a scan, and prefix reuse."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from power.runtime.speculators.base import DraftContext
from power.runtime.speculators.ngram import NGramSpeculator


def _propose(spec: NGramSpeculator, tokens: list[int], budget: int = 8) -> list[int]:
    return spec.propose(DraftContext(tokens, budget)).tokens


def _scan(tokens: list[int], budget: int, min_order: int, max_order: int) -> list[int]:
    """Reference: the longest order whose suffix occurred earlier; the most recent such occurrence."""
    for n in range(max_order, min_order - 1, -1):
        if len(tokens) < n:
            continue
        suffix = tokens[-n:]
        for end in range(len(tokens) - 2, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + budget]
    return []


def test_proposes_what_followed_the_most_recent_earlier_occurrence():
    spec = NGramSpeculator(min_order=2, max_order=3)
    tokens = [5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2]
    assert _propose(spec, tokens, budget=3) == [7, 8, 1]


def test_longer_orders_win_over_more_recent_shorter_matches():
    spec = NGramSpeculator(min_order=1, max_order=3)
    tokens = [6, 1, 2, 3, 4, 2, 3, 9, 0, 1, 2, 3]
    # "1 2 3" occurred at the start (-> 4); the more recent "2 3" alone would say 9.
    assert _propose(spec, tokens, budget=2) == [4, 2]


def test_no_match_and_no_budget_propose_nothing():
    spec = NGramSpeculator(min_order=2, max_order=4)
    assert _propose(spec, [1, 2, 3, 4]) == []
    assert _propose(spec, [1, 2, 1, 2], budget=0) == []


def test_proposals_stop_at_the_end_of_the_history():
    spec = NGramSpeculator(min_order=2, max_order=2)
    assert _propose(spec, [1, 2, 3, 1, 2], budget=8) == [3, 1, 2]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 6))
def test_incremental_index_matches_a_scan_at_every_step(tokens, budget):
    spec = NGramSpeculator(min_order=2, max_order=4)
    for length in range(1, len(tokens) + 1):
        assert _propose(spec, tokens[:length], budget) == _scan(tokens[:length], budget, 2, 4)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.integers(0, 40),
)
def test_prefix_reuse_keeps_the_shared_prefix_and_equals_a_fresh_index(first, second, shared):
    reused = NGramSpeculator(min_order=2, max_order=4)
    reused.begin(first)
    _propose(reused, first)
    follow_up = first[:shared] + second
    reused.begin(follow_up)
    fresh = NGramSpeculator(min_order=2, max_order=4)
    fresh.begin(follow_up)
    continuation = follow_up + [1, 2, 3, 1, 2]
    for length in range(len(follow_up), len(continuation) + 1):
        assert _propose(reused, continuation[:length]) == _propose(fresh, continuation[:length])


def test_checkpoint_and_restore_rewind_the_index():
    spec = NGramSpeculator(min_order=2, max_order=2)
    spec.begin([1, 2, 3])
    checkpoint = spec.checkpoint()
    assert _propose(spec, [1, 2, 3, 1, 2, 9, 1, 2]) == [9, 1, 2]
    spec.restore(checkpoint)
    assert spec.history == [1, 2, 3]
    assert _propose(spec, [1, 2, 3, 1, 2]) == [3, 1, 2]


def test_reset_forgets_everything():
    spec = NGramSpeculator(min_order=2, max_order=2)
    _propose(spec, [1, 2, 3, 1, 2])
    spec.reset()
    assert _propose(spec, [7, 1, 2]) == []
