"""Exactness: speculative token IDs equal autoregressive token IDs, for every speculator, trunk, K and S.

Every stream is 256 tokens on the fixtures. The dense fixture runs the full
matrix (every speculator x K in {1, 3, 7, 10} x S in {K, K-1, 1}); the hybrid,
whose per-row recurrence makes each forward ~4x dearer, runs the full K x S
matrix for the oracle and n-gram and one S per K for the learned drafters; the
real Gemma 270M runs a representative subset over a shorter stream.
DSpark runs with its confidence gate at 0 so that its blocks are verified (with
random weights its header threshold gates nearly every block).
"""

from __future__ import annotations

import pytest
from spec_helpers import (
    DRAFTERS,
    Oracle,
    built,
    copying_mtp_sidecar,
    fixture_dir,
    gguf,
    oracle_for,
    plain_stream,
    prompt_for,
    speculative,
    trunk,
)

from power.documents.kv_types import BF16, F16, Q8_0
from power.runtime.gguf_weights import GGUFFile
from power.runtime.speculators.base import Decline, SpeculatorRequest
from power.runtime.speculators.registry import build, create

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

FIXTURE_TOKENS = 256
GEMMA_TOKENS = 40
KS = [(k, s) for k in (1, 3, 7, 10) for s in sorted({k, k - 1, 1}) if s >= 1]


def _speculator(kind: str, model: str, k: int, s: int, n_tokens: int, kv_type: str):
    if kind == "oracle":
        return oracle_for(model, n_tokens, then=k // 2, kv_type=kv_type)  # every round partially wrong, half-way in
    return built(kind, model, trunk(model, s, kv_type), kv_type)


def _assert_exact(model: str, kind: str, k: int, s: int, n_tokens: int, kv_type: str = "f32") -> None:
    speculator = _speculator(kind, model, k, s, n_tokens, kv_type)
    generation = speculative(model, speculator, k, s, kv_type=kv_type).generate(prompt_for(model), n_tokens)
    reference = plain_stream(model, n_tokens, kv_type=kv_type)
    assert tuple(generation.tokens) == reference
    assert generation.stats.proposed > 0
    guarded_replays = generation.stats.replays > 0
    assert generation.stats.clamps == int(guarded_replays)  # a replay clamps the request, once


@pytest.mark.parametrize("k, s", KS)
@pytest.mark.parametrize("kind", ["oracle", "ngram", *DRAFTERS])
def test_dense_fixture_greedy_speculation_equals_autoregressive(kind, k, s):
    _assert_exact("dense", kind, k, s, FIXTURE_TOKENS)


@pytest.mark.parametrize("k, s", KS)
@pytest.mark.parametrize("kind", ["oracle", "ngram", "mtp", *DRAFTERS])
def test_hybrid_fixture_greedy_speculation_equals_autoregressive(kind, k, s):
    _assert_exact("hybrid", kind, k, s, FIXTURE_TOKENS)


@pytest.mark.parametrize("k", [3, 7])
def test_a_gemma3_mtp_sidecar_speculates_exactly_through_accepted_and_rejected_chains(k):
    """The Gemma 3 nextn head (from an MTP-only sidecar) over a long greedy stream: some chains land, some miss."""
    n_tokens = 128
    head = create("mtp", SpeculatorRequest(trunk("gemma3"), target=gguf("gemma3"),
                                           drafter=GGUFFile(copying_mtp_sidecar())))
    generation = speculative("gemma3", head, k, k).generate(prompt_for("gemma3"), n_tokens)
    assert tuple(generation.tokens) == plain_stream("gemma3", n_tokens)
    assert 0 < generation.stats.accepted < generation.stats.proposed


@pytest.mark.slow
@pytest.mark.parametrize("kind, k, s", [("oracle", 10, 9), ("ngram", 7, 7), ("ngram", 3, 1), ("oracle", 1, 1)])
def test_gemma_greedy_speculation_equals_autoregressive(kind, k, s):
    _assert_exact("gemma", kind, k, s, GEMMA_TOKENS)


# The KV cache types: each cache row is rounded as it is written, by itself, so speculation stays exact with each (the
# fixtures' 16-wide heads hold no q8_0 block: gemma3's 32-wide and the real Gemma's 256-wide ones do). S < K on the
# hybrid: guarded replays.
KV_CASES = [("dense", "oracle", F16), ("dense", "dflash", BF16), ("hybrid", "mtp", F16), ("hybrid", "ngram", BF16),
            ("gemma3", "oracle", F16), ("gemma3", "oracle", BF16), ("gemma3", "oracle", Q8_0), ("gemma", "ngram", Q8_0)]


@pytest.mark.parametrize("model, kind, kv_type", KV_CASES)
def test_greedy_speculation_equals_autoregressive_with_every_kv_type(model, kind, kv_type):
    _assert_exact(model, kind, 7, 3, GEMMA_TOKENS if model == "gemma" else FIXTURE_TOKENS, kv_type)


@pytest.mark.parametrize("verify", ["match", "rejection"])
@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_seeded_stochastic_stream_with_an_oracle_drafter(model, verify):
    """`match` must reproduce the seeded autoregressive stream; `rejection` must stay a valid seeded stream."""
    params = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 1234}
    reference = speculative(model, None, 0, 1, **params).generate(prompt_for(model), FIXTURE_TOKENS).tokens
    oracle = Oracle(prompt_for(model) + reference, then=2, vocab=trunk(model).config.vocab_size)
    generation = speculative(model, oracle, 7, 7, verify=verify, **params).generate(prompt_for(model), FIXTURE_TOKENS)
    if verify == "match":
        assert generation.stats.accepted > 0
        assert generation.tokens == reference
    else:  # a deterministic drafter under the rejection rule: accepted with probability p(draft)
        assert len(generation.tokens) == FIXTURE_TOKENS
        repeat = speculative(model, Oracle(prompt_for(model) + reference, then=2, vocab=trunk(model).config.vocab_size),
                             7, 7, verify=verify, **params).generate(prompt_for(model), FIXTURE_TOKENS)
        assert repeat.tokens == generation.tokens  # seeded: reproducible
    other_seed = speculative(model, None, 0, 1, **params | {"seed": 99}).generate(prompt_for(model), FIXTURE_TOKENS)
    assert other_seed.tokens != reference  # the stream really depends on the seed


def test_drafters_decline_a_target_they_cannot_serve():
    request = SpeculatorRequest(trunk("gemma"), drafter=GGUFFile(fixture_dir() / "dflash-drafter.gguf"),
                                target=gguf("gemma"))
    declined = build("dflash", request)
    assert isinstance(declined, Decline) and "d_model" in declined.reason
    mislabeled = build("dflash", SpeculatorRequest(trunk("dense"),
                                                   drafter=GGUFFile(fixture_dir() / "dspark-drafter.gguf"),
                                                   target=gguf("dense")))
    assert isinstance(mislabeled, Decline) and "dspark" in mislabeled.reason
