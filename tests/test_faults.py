"""Faults and cancellation: a failed or cancelled round leaves the state of a run that never attempted it.

Each test commits some history, breaks one round (an exception after any of the
transaction's steps, a target forward that fails after mutating its state, or a
cancellation), checks the committed state is exactly what it was, then finishes
the request and checks no token was lost or duplicated.
"""

from __future__ import annotations

import threading

import pytest
import torch
from spec_helpers import oracle_for, plain_stream, prompt_for, trunk

from power.runtime.decoder import Decoder
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.transaction import Cancelled, SpeculativeSequence, Step

N = 48
S = 2  # a small resident window: the broken round below rejects past it on the hybrid (the replay path)
PLAN = [None, 3, None, 0]  # round 4 (the one broken) rejects every proposal


class Boom(RuntimeError):
    pass


def _state(seq: SpeculativeSequence):
    position, recurrent = seq.trunk.checkpoint()
    tensors = [] if recurrent is None else [t.clone() for s in recurrent.values() for t in (s.conv, s.delta)]
    return list(seq.tokens), position, tensors, seq.speculator.checkpoint()


def _assert_same_state(a, b) -> None:
    assert a[0] == b[0] and a[1] == b[1] and a[3] == b[3]
    assert len(a[2]) == len(b[2]) and all(torch.equal(x, y) for x, y in zip(a[2], b[2], strict=True))


def _sequence(model: str) -> SpeculativeSequence:
    seq = SpeculativeSequence(trunk(model, S), Sampler(SamplingParams()), oracle_for(model, N, PLAN))
    seq.start(prompt_for(model))
    for _ in range(3):
        seq.round(7)
    return seq


def _finish(seq: SpeculativeSequence) -> None:
    while len(seq.emitted) < N:
        seq.round(min(7, N - len(seq.emitted) - 1))


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("step", [s for s in Step if s is not Step.RESTORE])
def test_a_fault_after_any_step_rolls_the_round_back(model, step):
    seq = _sequence(model)
    before = _state(seq)
    restored = []

    def fail_at(current: Step) -> None:
        if current is Step.RESTORE:
            restored.append(current)
        elif current is step:
            raise Boom(step.name)

    seq.observer = fail_at
    with pytest.raises(Boom):
        seq.round(7)
    assert restored == [Step.RESTORE]
    _assert_same_state(_state(seq), before)
    seq.observer = None
    _finish(seq)
    assert seq.emitted == list(plain_stream(model, N))[: len(seq.emitted)] and len(seq.emitted) == N


class _ForwardFailsAfterMutating:
    """A target whose forward writes its caches and recurrent state, then fails (a lost device, an OOM)."""

    def __init__(self, inner, fail_on_call: int) -> None:
        self._inner, self._fail_on, self._calls = inner, fail_on_call, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward(self, tokens, taps=()):
        out = self._inner.forward(tokens, taps)
        self._calls += 1
        if self._calls == self._fail_on:
            raise Boom("forward failed after writing state")
        return out


@pytest.mark.parametrize("model, fail_on_call", [("dense", 1), ("hybrid", 1), ("hybrid", 2)])
def test_a_target_forward_that_fails_after_mutating_state_is_rolled_back(model, fail_on_call):
    """Call 2 on the hybrid is the exact replay the broken round needs: a failing replay is rolled back too."""
    seq = _sequence(model)
    seq.trunk = _ForwardFailsAfterMutating(seq.trunk, fail_on_call=fail_on_call)
    before = _state(seq)
    with pytest.raises(Boom):
        seq.round(7)
    _assert_same_state(_state(seq), before)
    _finish(seq)
    assert seq.emitted == list(plain_stream(model, N))


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("step", [Step.CHECKPOINT, Step.PROPOSE, Step.VERIFY, Step.SAMPLE, Step.COMMIT])
def test_cancellation_mid_round_keeps_exactly_the_committed_tokens(model, step):
    cancel = threading.Event()
    rounds = []

    def cancel_in_round_five(current: Step) -> None:
        if current is Step.CHECKPOINT:
            rounds.append(current)
        if len(rounds) == 5 and current is step:
            cancel.set()  # another thread cancels while the round is in flight

    decoder = Decoder(trunk(model, S), Sampler(SamplingParams()), oracle_for(model, N, PLAN), SchedulerConfig(k=7, s=S))
    generation = decoder.generate(prompt_for(model), N, cancel=cancel, observer=cancel_in_round_five)
    assert generation.cancelled
    committed = generation.tokens
    assert committed == list(plain_stream(model, N))[: len(committed)]
    assert generation.sequence.trunk.position == len(generation.sequence.tokens) - 1
    assert generation.stats.rounds == 4  # the fifth round was rolled back, not counted


def test_a_cancelled_round_raises_cancelled_naming_the_step():
    cancel = threading.Event()
    seq = SpeculativeSequence(trunk("dense"), Sampler(SamplingParams()), oracle_for("dense", N), cancel=cancel)
    seq.start(prompt_for("dense"))
    cancel.set()
    with pytest.raises(Cancelled, match="step 1 \\(checkpoint\\)"):
        seq.round(3)
    assert seq.emitted == list(plain_stream("dense", N))[:1]
