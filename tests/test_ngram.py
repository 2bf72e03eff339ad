"""The n-gram speculator: what it proposes (llama.cpp ngram-mod's match length and draft lengths), that its
incremental index equals a scan, and prefix reuse."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from power.runtime.speculators.base import DraftContext, NGramWindow
from power.runtime.speculators.ngram import NGramSpeculator


def _ngram(match: int, draft_min: int = 1, draft_max: int = 64) -> NGramSpeculator:
    return NGramSpeculator(NGramWindow(match, draft_min, draft_max))


def _propose(spec: NGramSpeculator, tokens: list[int], budget: int = 8) -> list[int]:
    return spec.propose(DraftContext(tokens, budget)).tokens


def _scan(tokens: list[int], budget: int, match: int, draft_min: int = 1, draft_max: int = 64) -> list[int]:
    """Reference: what followed the most recent earlier occurrence of the last `match` tokens."""
    if len(tokens) < match:
        return []
    suffix = tokens[-match:]
    for end in range(len(tokens) - 2, match - 2, -1):
        if tokens[end - match + 1 : end + 1] == suffix:
            draft = tokens[end + 1 : end + 1 + draft_max]
            return draft[:budget] if len(draft) >= draft_min else []
    return []


def test_proposes_what_followed_the_most_recent_earlier_occurrence():
    spec = _ngram(match=2)
    tokens = [5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2]
    assert _propose(spec, tokens, budget=3) == [7, 8, 1]


def test_the_match_length_is_exact():
    tokens = [6, 1, 2, 3, 4, 2, 3, 9, 0, 1, 2, 3]
    # "1 2 3" occurred at the start (-> 4); the more recent "2 3" says 9: each match length sees its own.
    assert _propose(_ngram(match=3), tokens, budget=2) == [4, 2]
    assert _propose(_ngram(match=2), tokens, budget=2) == [9, 0]


def test_a_draft_shorter_than_draft_min_is_dropped_and_draft_max_caps_it():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert _propose(_ngram(match=2, draft_min=7), tokens, budget=8) == []  # 3 4 5 6 1 2: six tokens
    assert _propose(_ngram(match=2, draft_min=6), tokens, budget=8) == [3, 4, 5, 6, 1, 2]
    assert _propose(_ngram(match=2, draft_max=3), tokens, budget=8) == [3, 4, 5]
    # the round's budget cuts a kept draft; draft_min judges the draft, not the budget
    assert _propose(_ngram(match=2, draft_min=6), tokens, budget=2) == [3, 4]


def test_no_match_and_no_budget_propose_nothing():
    spec = _ngram(match=2)
    assert _propose(spec, [1, 2, 3, 4]) == []
    assert _propose(spec, [1, 2, 1, 2], budget=0) == []


def test_proposals_stop_at_the_end_of_the_history():
    spec = _ngram(match=2)
    assert _propose(spec, [1, 2, 3, 1, 2], budget=8) == [3, 1, 2]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 6))
def test_incremental_index_matches_a_scan_at_every_step(tokens, budget):
    spec = _ngram(match=2, draft_min=2, draft_max=5)
    for length in range(1, len(tokens) + 1):
        assert _propose(spec, tokens[:length], budget) == _scan(tokens[:length], budget, 2, 2, 5)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.integers(0, 40),
)
def test_prefix_reuse_keeps_the_shared_prefix_and_equals_a_fresh_index(first, second, shared):
    reused = _ngram(match=2)
    reused.begin(first)
    _propose(reused, first)
    follow_up = first[:shared] + second
    reused.begin(follow_up)
    fresh = _ngram(match=2)
    fresh.begin(follow_up)
    continuation = follow_up + [1, 2, 3, 1, 2]
    for length in range(len(follow_up), len(continuation) + 1):
        assert _propose(reused, continuation[:length]) == _propose(fresh, continuation[:length])


def test_checkpoint_and_restore_rewind_the_index():
    spec = _ngram(match=2)
    spec.begin([1, 2, 3])
    checkpoint = spec.checkpoint()
    assert _propose(spec, [1, 2, 3, 1, 2, 9, 1, 2]) == [9, 1, 2]
    spec.restore(checkpoint)
    assert spec.history == [1, 2, 3]
    assert _propose(spec, [1, 2, 3, 1, 2]) == [3, 1, 2]


def test_reset_forgets_everything():
    spec = _ngram(match=2)
    _propose(spec, [1, 2, 3, 1, 2])
    spec.reset()
    assert _propose(spec, [7, 1, 2]) == []
