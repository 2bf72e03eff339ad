"""Requests decoded side by side: each request's tokens are the bits it gets alone.

The reference for a request is the same request decoded alone on a one-slot trunk
(plain or speculative: greedy speculation equals plain decoding, tests/test_exactness.py).
The batched runs put several requests in the slots of one trunk, with prompts of
different lengths (so prefills and decodes overlap and segments sit at every row
offset), speculation that drafts a lot beside speculation that drafts nothing,
the hybrid's guarded replays (S < K), seeded sampling under both rules, and
requests cancelled or broken mid-batch. Then prefix reuse: a request that shares a
prompt prefix with a slot's cache computes only the rest, with the same logits.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import pytest
import torch
from spec_helpers import CAPACITY, built, gguf, prompt_for, trunk

from power.documents.arithmetic import FLOAT32, QUANTISED
from power.runtime.decoder import Decoder, DecodeRequest, Decoding
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.transaction import Step
from power.runtime.trunks import load_trunk

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

GREEDY = SamplingParams()
SLOTS = 4
TOKENS = 40
GEMMA_TOKENS = 16
K, S = 7, 2  # S < K: a rejection past two rows on the hybrid replays


def fixture_prompts() -> list[list[int]]:
    """Four prompts of different lengths: two echo-like ones (n-gram drafts) and two that never repeat."""
    base = prompt_for("dense")
    echo = base * 3 + base[:5]
    return [echo, [(t * 7 + 3) % 96 + 20 for t in range(41)], base[:7], [*base[::-1], *echo[:40]]]


def gemma_prompts() -> list[list[int]]:
    from power.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gguf("gemma"))
    texts = ["The capital of France is Paris. The capital of Italy is Rome. The capital of France is",
             "Once upon a time", "1, 2, 3, 4, 5,", "Question: What is the capital of Spain?\nAnswer:"]
    return [tok.encode(text) for text in texts]


@lru_cache(maxsize=None)
def slotted(name: str, slots: int, s: int, arithmetic: str = QUANTISED):
    """A trunk of `slots` slots with the same per-slot context as spec_helpers' one-slot trunks."""
    n_ctx = 1024 if name == "gemma" else 2048
    return load_trunk(gguf(name), n_ctx=n_ctx, verify_capacity=CAPACITY, snapshot_rows=s if name == "hybrid" else 0,
                      arithmetic=arithmetic, slots=slots)


def decoder(model: str, kind: str, slots: int, arithmetic: str = QUANTISED) -> Decoder:
    if model != "gemma" and arithmetic == QUANTISED and slots == 1:
        target = trunk(model, S)
    else:
        target = slotted(model, slots, S, arithmetic)
    for slot in range(slots):
        target.reset(slot)
    return Decoder(target, Sampler(SamplingParams()), None if kind == "none" else built(kind, model, target),
                   SchedulerConfig(k=K, s=S))


def run(decoder_: Decoder, prompts, params=GREEDY, tokens: int = TOKENS, **request) -> list[Decoding]:
    decodings = [decoder_.submit(DecodeRequest(p, tokens, Sampler(params), **request)) for p in prompts]
    while decoder_.busy:
        decoder_.step()
    return decodings


def alone(model: str, kind: str, prompts, params=GREEDY, tokens: int = TOKENS, **trunk_kw) -> list[list[int]]:
    out = []
    for prompt in prompts:
        (decoding,) = run(decoder(model, kind, 1, **trunk_kw), [prompt], params, tokens)
        out.append(decoding.generation.tokens)
    return out


@lru_cache(maxsize=None)
def reference(model: str, params: SamplingParams = GREEDY, arithmetic: str = QUANTISED) -> tuple[tuple[int, ...], ...]:
    """Each prompt decoded plainly, alone, on a one-slot trunk."""
    if model == "gemma":
        return tuple(tuple(t) for t in alone(model, "none", gemma_prompts(), params, GEMMA_TOKENS,
                                             arithmetic=arithmetic))
    return tuple(tuple(t) for t in alone(model, "none", fixture_prompts(), params))


def tokens_of(decodings: list[Decoding]) -> tuple[tuple[int, ...], ...]:
    for d in decodings:
        assert d.error is None, d.error
    return tuple(tuple(d.generation.tokens) for d in decodings)


@pytest.mark.parametrize("model, kind", [("dense", "none"), ("dense", "ngram"), ("dense", "dflash"),
                                         ("dense", "dspark"), ("hybrid", "none"), ("hybrid", "ngram"),
                                         ("hybrid", "mtp"), ("hybrid", "dflash"), ("hybrid", "dspark")])
def test_requests_side_by_side_emit_the_tokens_they_emit_alone(model, kind):
    together = run(decoder(model, kind, SLOTS), fixture_prompts())
    assert tokens_of(together) == reference(model)
    if kind != "none":
        assert sum(d.generation.stats.proposed for d in together) > 0
    if model == "hybrid" and kind == "ngram":
        assert sum(d.generation.stats.replays for d in together) > 0  # S < K: guarded replays happened mid-batch


def test_more_requests_than_slots_wait_and_still_match():
    prompts = fixture_prompts() * 2
    together = run(decoder("dense", "ngram", 3), prompts)
    assert tokens_of(together) == reference("dense") * 2


def test_more_decoding_requests_than_rows_take_turns():
    """Twelve slots, eleven rows: every round one request waits; each still gets its own tokens."""
    prompts = (fixture_prompts() * 3)[:12]
    together = run(decoder("dense", "none", 12), prompts, tokens=12)
    assert tokens_of(together) == tuple(t[:12] for t in reference("dense") * 3)[:12]


def test_every_prompt_arriving_together_is_read_in_the_first_step():
    """Four prompts of 20-30 tokens, no two of which fit one 32-row prefill forward: each still gets its piece in
    the first step (a forward each), so none waits for the others' decode rounds, and each emits its alone tokens."""
    prompts = [prompt_for("dense")[:20], fixture_prompts()[1][:30], prompt_for("dense")[3:28],
               fixture_prompts()[0][:24]]
    dec = decoder("dense", "ngram", SLOTS)
    decodings = [dec.submit(DecodeRequest(p, 8, Sampler(GREEDY))) for p in prompts]
    dec.step()
    assert all(d.stats.prefill_s > 0 and d.decoding for d in decodings)
    while dec.busy:
        dec.step()
    assert tokens_of(decodings) == tuple(tuple(t) for t in alone("dense", "none", prompts, tokens=8))


@pytest.mark.parametrize("verify", ["match", "rejection"])
def test_seeded_requests_side_by_side_emit_their_alone_tokens(verify):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234, verify=verify)
    prompts = fixture_prompts()
    expected = alone("dense", "ngram", prompts, params)
    together = run(decoder("dense", "ngram", SLOTS), prompts, params)
    assert [list(t) for t in tokens_of(together)] == expected
    if verify == "match":
        assert tokens_of(together) == reference("dense", params)


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("step", [Step.PROPOSE, Step.VERIFY, Step.SAMPLE, Step.COMMIT])
def test_a_request_cancelled_or_broken_mid_batch_leaves_the_others_untouched(model, step):
    cancel = threading.Event()

    def at_round(n: int, act):
        rounds = []

        def observe(current: Step) -> None:
            if current is Step.CHECKPOINT:
                rounds.append(current)
            if len(rounds) == n and current is step:
                act()
        return observe

    def fault() -> None:
        raise RuntimeError("injected fault")

    break_round_three, cancel_round_five = at_round(3, fault), at_round(5, cancel.set)

    dec = decoder(model, "ngram", SLOTS)
    prompts = fixture_prompts()
    sampler = Sampler(SamplingParams())
    decodings = [dec.submit(DecodeRequest(prompts[0], TOKENS, sampler, observer=break_round_three)),
                 dec.submit(DecodeRequest(prompts[1], TOKENS, sampler)),
                 dec.submit(DecodeRequest(prompts[2], TOKENS, sampler, cancel=cancel, observer=cancel_round_five)),
                 dec.submit(DecodeRequest(prompts[3], TOKENS, sampler))]
    while dec.busy:
        dec.step()
    broken, fine, cancelled, other = decodings
    assert isinstance(broken.error, RuntimeError) and broken.generation is None
    assert cancelled.generation.cancelled
    truth = reference(model)
    assert list(truth[2][: len(cancelled.generation.tokens)]) == cancelled.generation.tokens
    assert len(cancelled.generation.tokens) < TOKENS
    assert tokens_of([fine, other]) == (truth[1], truth[3])
    # The slots of the broken and the cancelled requests serve new requests exactly.
    again = run(dec, [prompts[0], prompts[2]])
    assert tokens_of(again) == (truth[0], truth[2])


class _FailingForward:
    """Makes the trunk's n-th shared verify forward fail, after it has written every sequence's caches and state."""

    def __init__(self, target, on_shared_call: int) -> None:
        self.on_call, self.calls = on_shared_call, 0
        self.original = target.forward_parts

    def __call__(self, parts, taps=()):
        out = self.original(parts, taps)
        self.calls += len(parts) > 1
        if self.calls == self.on_call and len(parts) > 1:
            raise RuntimeError("the device went away")
        return out


def test_a_failed_shared_forward_fails_the_requests_in_it_and_the_decoder_goes_on():
    dec = decoder("hybrid", "ngram", SLOTS)
    failing = _FailingForward(dec.trunk, on_shared_call=5)
    dec.trunk.forward_parts = failing
    try:
        failed = run(dec, fixture_prompts())
    finally:
        del dec.trunk.forward_parts
    assert any(d.error is not None for d in failed)
    assert tokens_of([d for d in failed if d.error is None]) == tuple(
        t for d, t in zip(failed, reference("hybrid"), strict=True) if d.error is None)
    assert tokens_of(run(dec, fixture_prompts())) == reference("hybrid")


@pytest.mark.parametrize("arithmetic", [QUANTISED, pytest.param(FLOAT32, marks=pytest.mark.slow)])
def test_gemma_requests_side_by_side_emit_their_alone_tokens(arithmetic):
    """The plans' default arithmetic (real rows) and the float32 reference (fixed shapes), with n-gram drafts."""
    together = run(decoder("gemma", "ngram", SLOTS, arithmetic), gemma_prompts(), tokens=GEMMA_TOKENS)
    assert tokens_of(together) == reference("gemma", GREEDY, arithmetic)


# --- prefix reuse ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["dense", "hybrid", "gemma"])
def test_a_reused_prefix_gives_the_logits_of_recomputing_it(model):
    """Prefill A, then B sharing A's first 70 tokens from A's cache: B's every row equals B prefilled from scratch."""
    target = slotted(model, 2, S)
    vocab = target.config.vocab_size
    shared = [(t * 13 + 5) % (vocab - 10) + 2 for t in range(70)]
    a, b = shared + [3, 4, 5], shared + [6, 7, 8, 9, 10]
    target.reset(1)
    fresh = target.prefill(b, all_logits=True, slot=1)
    target.reset(0)
    target.prefill(a, slot=0)
    reuse = target.reusable_prefix(70, slot=0)
    assert reuse == 64  # whole prefill chunks
    target.resume(reuse, slot=0)
    reused = target.prefill(b[reuse:], all_logits=True, slot=0)
    assert torch.equal(reused.logits, fresh.logits[reuse:])


@pytest.mark.parametrize("model, kind", [("dense", "ngram"), ("hybrid", "none"), ("hybrid", "mtp")])
def test_a_request_sharing_a_cached_prefix_reuses_it_and_emits_the_same_tokens(model, kind):
    system = [(t * 11 + 7) % 90 + 20 for t in range(80)]
    first, second = system + prompt_for("dense")[:6], system + prompt_for("dense")[6:]
    expected = alone(model, kind, [second])[0]
    dec = decoder(model, kind, 2)
    (a,) = run(dec, [first])
    (b,) = run(dec, [second])
    assert a.generation.reused == 0 and b.generation.reused == 64
    assert b.generation.tokens == expected
    # A multi-turn follow-up: the first request's prompt and answer, then more.
    follow_up = first + a.generation.tokens + [33, 44, 55]
    (c,) = run(dec, [follow_up])
    assert c.generation.reused == 64
    assert c.generation.tokens == alone(model, kind, [follow_up])[0]
