"""The cost governor's verdicts and accounting rules, on synthetic step timings."""

from __future__ import annotations

import pytest

from power.runtime.governor import ChainGovernor, GovernorConfig, Phase

PLAIN = 0.010  # seconds per plain step
VERDICTS = GovernorConfig(loss_budget=None)  # the state machine alone, without the request's loss budget
BUDGET = 1 + (GovernorConfig().loss_budget or 0.0)  # a request's decode time over its plain-rate time, at most


def _plain_steps(gov: ChainGovernor, n: int, seconds: float = PLAIN) -> None:
    for _ in range(n):
        assert not gov.speculate()
        gov.record(member=None, tokens=1, seconds=seconds)


def _spec_steps(gov: ChainGovernor, n: int, tokens: int, seconds: float, accepted: int | None = None) -> None:
    for _ in range(n):
        assert gov.speculate()
        gov.record(member=0, tokens=tokens, seconds=seconds, accepted=tokens - 1 if accepted is None else accepted)


def _through_baseline(gov: ChainGovernor) -> None:
    _plain_steps(gov, gov.config.baseline_steps)
    assert gov.members[0].phase is Phase.PROBE


def test_a_winning_speculator_holds():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 8, tokens=4, seconds=0.012)  # 3 ms per token against 10
    assert gov.members[0].phase is Phase.HOLD and gov.members[0].wins == 1 and gov.parks == 0


def test_a_losing_speculator_is_parked_and_reprobed_with_backoff():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 8, tokens=1, seconds=0.015, accepted=1)  # accepted something, still slower per token
    assert gov.members[0].phase is Phase.PARKED and gov.parks == 1
    _plain_steps(gov, 32)
    assert gov.members[0].phase is Phase.PROBE
    _spec_steps(gov, 3, tokens=1, seconds=0.015, accepted=1)  # after a loss the re-probe is short
    assert gov.members[0].phase is Phase.PARKED and gov.parks == 2
    _plain_steps(gov, 63)
    assert gov.members[0].phase is Phase.PARKED  # backed off to 64
    _plain_steps(gov, 1)
    assert gov.members[0].phase is Phase.PROBE


def test_backoff_is_capped():
    gov = ChainGovernor(GovernorConfig(first_park=4, max_park=8, loss_budget=None))
    _through_baseline(gov)
    parks = []
    for _ in range(4):
        _spec_steps(gov, gov.config.probe_steps if gov.members[0].losses == 0 else 3, tokens=1, seconds=0.02,
                    accepted=1)
        steps = 0
        while not gov.speculate():
            _plain_steps(gov, 1)
            steps += 1
        parks.append(steps)
    assert parks == [4, 8, 8, 8]


def test_a_probe_ends_early_after_four_steps_that_accepted_nothing():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 3, tokens=1, seconds=0.001, accepted=0)
    assert gov.members[0].phase is Phase.PROBE
    _spec_steps(gov, 1, tokens=1, seconds=0.001, accepted=0)
    assert gov.members[0].phase is Phase.PARKED


def test_a_head_pass_that_proposed_nothing_is_a_speculative_sample():
    """A draft head under its confidence gate (speculative one-token steps that verified nothing) is costed as
    speculation: a probe of them that costs more than plain steps parks the head, and none of them leaks into the
    plain baseline. (A lookup that found nothing ran no head: the transaction makes that a plain round.)"""
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    for _ in range(gov.config.probe_steps - 1):
        gov.record(member=0, tokens=1, seconds=PLAIN * 1.05, accepted=0, proposed=0)
    assert gov.members[0].phase is Phase.PROBE  # no verification was paid: the early-loss run never started
    gov.record(member=0, tokens=1, seconds=PLAIN * 1.05, accepted=0, proposed=0)
    assert gov.members[0].phase is Phase.PARKED
    assert gov.plain_cost == PLAIN


def test_a_confidence_gate_refusing_neither_extends_nor_breaks_a_run_of_rejected_rounds():
    """Only verifications that accepted nothing end a probe early; a gated-out step between them changes nothing."""
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 3, tokens=1, seconds=PLAIN * 1.6, accepted=0)
    gov.record(member=0, tokens=1, seconds=PLAIN, accepted=0, proposed=0)
    assert gov.members[0].phase is Phase.PROBE
    _spec_steps(gov, 1, tokens=1, seconds=PLAIN * 1.6, accepted=0)
    assert gov.members[0].phase is Phase.PARKED


def test_parked_steps_feed_the_plain_baseline_except_the_first():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 4, tokens=1, seconds=0.02, accepted=0)
    assert gov.members[0].phase is Phase.PARKED
    gov.record(member=None, tokens=1, seconds=1.0)  # pays the switch: not a sample
    _plain_steps(gov, 5, seconds=0.004)
    assert abs(gov.plain_cost - (3 * PLAIN + 5 * 0.004) / 8) < 1e-12


def test_a_wrong_win_is_caught_within_the_hold_window():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 8, tokens=4, seconds=0.012)
    assert gov.members[0].phase is Phase.HOLD
    _spec_steps(gov, 7, tokens=1, seconds=0.03, accepted=0)
    assert gov.members[0].phase is Phase.HOLD
    _spec_steps(gov, 1, tokens=1, seconds=0.03, accepted=0)
    assert gov.members[0].phase is Phase.PARKED and gov.members[0].losses == 1


def test_a_hold_remeasures_the_baseline_then_resumes():
    gov = ChainGovernor(GovernorConfig(hold_steps=10, loss_budget=None))
    _through_baseline(gov)
    _spec_steps(gov, 8, tokens=4, seconds=0.012)
    _spec_steps(gov, 10, tokens=4, seconds=0.012)
    assert gov.members[0].phase is Phase.BASELINE
    _plain_steps(gov, 3)
    assert gov.members[0].phase is Phase.HOLD and gov.members[0].wins == 1


def test_a_new_request_caps_the_park_and_forgets_the_backoff():
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    _spec_steps(gov, 8, tokens=1, seconds=0.02, accepted=1)
    _plain_steps(gov, 32)
    _spec_steps(gov, 3, tokens=1, seconds=0.02, accepted=1)
    _plain_steps(gov, 2)
    assert gov.members[0].phase is Phase.PARKED  # a 64-step park, 62 to go
    gov.new_request()
    _plain_steps(gov, 30)
    assert gov.members[0].phase is Phase.PROBE  # capped at 32
    _spec_steps(gov, 3, tokens=1, seconds=0.02, accepted=1)  # the loss is remembered: a short probe
    steps = 0
    while not gov.speculate():
        _plain_steps(gov, 1)
        steps += 1
    assert steps == 32  # the backoff was forgotten


def test_rounds_that_win_on_average_hold_however_uneven_they_are():
    """Rounds of a real head alternate misses and long runs: 1 token or 6 tokens for 16 ms against 10 ms a plain token.
    Over the window that is 32 ms for 7 tokens, 4.6 ms a token: a win, though the mean of each round's own cost per
    token (16 and 2.7 ms: 9.3 ms) is close to the plain cost and a window with more misses would cross it."""
    gov = ChainGovernor(VERDICTS)
    _through_baseline(gov)
    for _ in range(4):
        _spec_steps(gov, 1, tokens=1, seconds=0.016, accepted=0)
        _spec_steps(gov, 1, tokens=6, seconds=0.016)
    assert gov.members[0].phase is Phase.HOLD and gov.parks == 0
    for tokens in [1, 1, 6] * 40:  # in hold: two misses to every long run, still 48 ms for 8 tokens
        while gov.members[0].phase is Phase.BASELINE:  # the baseline re-measured every hold_steps
            _plain_steps(gov, 1)
        _spec_steps(gov, 1, tokens=tokens, seconds=0.016, accepted=tokens - 1)
    assert gov.parks == 0


def _member_steps(gov: ChainGovernor, member: int, n: int, tokens: int, seconds: float, accepted: int) -> None:
    for _ in range(n):
        assert gov.allowed()[member]
        gov.record(member=member, tokens=tokens, seconds=seconds, accepted=accepted)


def test_a_chain_parks_its_losing_head_and_keeps_its_lookup_proposing():
    """A lookup in front of a head: the head's rounds accept nothing and lose, the lookup's win. Only the head is
    parked; its park runs out on the lookup's steps, and the lookup never stops."""
    gov = ChainGovernor(VERDICTS, members=2)
    _plain_steps(gov, gov.config.baseline_steps)
    for _ in range(4):
        _member_steps(gov, 0, 1, tokens=4, seconds=0.012, accepted=3)
        _member_steps(gov, 1, 1, tokens=1, seconds=0.016, accepted=0)
    lookup, head = gov.members
    assert (head.phase, head.parks, lookup.phase, lookup.parks) == (Phase.PARKED, 1, Phase.PROBE, 0)
    assert gov.allowed() == (True, False) and gov.speculate()
    _member_steps(gov, 0, 4, tokens=4, seconds=0.012, accepted=3)
    assert lookup.phase is Phase.HOLD
    _member_steps(gov, 0, 28, tokens=4, seconds=0.012, accepted=3)
    assert gov.allowed() == (True, True) and head.phase is Phase.PROBE  # the 32-step park ran out on the lookup's steps
    assert gov.parks == 1 and gov.plain_cost == PLAIN


def test_a_member_remeasuring_the_baseline_makes_the_step_plain_for_every_member():
    gov = ChainGovernor(GovernorConfig(hold_steps=10, loss_budget=None), members=2)
    _plain_steps(gov, gov.config.baseline_steps)
    _member_steps(gov, 0, 8 + 10, tokens=4, seconds=0.012, accepted=3)
    assert gov.members[0].phase is Phase.BASELINE and gov.members[1].phase is Phase.PROBE
    assert gov.allowed() == (False, False)
    _plain_steps(gov, gov.config.baseline_steps)
    assert gov.allowed() == (True, True) and gov.members[0].phase is Phase.HOLD


def _request(gov: ChainGovernor, tokens: int, spec_seconds: float, spec_tokens: int = 1,
             wide_seconds: float | None = None, row_seconds: float = 0.0, prompt: int = 0,
             switch_seconds: float = 0.0) -> tuple[float, int]:
    """One request of `tokens` tokens after a prompt of `prompt`: plain steps cost PLAIN (the first after a
    speculative step `switch_seconds` more), the speculator's steps `spec_seconds` for `spec_tokens` tokens (accepting
    spec_tokens - 1) when the governor caps them at one proposal, `wide_seconds` when it does not, plus their
    catch-up, `row_seconds` for each row that landed since the speculator last proposed. Returns the request's decode
    seconds and its speculative steps."""
    gov.new_request(prompt)
    seconds, emitted, speculative, unseen, switching = 0.0, 0, 0, prompt, False
    while emitted < tokens:
        if gov.speculate():
            upkeep = row_seconds * unseen
            step = upkeep + (spec_seconds if gov.width_cap() == 1 or wide_seconds is None else wide_seconds)
            gov.record(member=0, tokens=spec_tokens, seconds=step, accepted=spec_tokens - 1, upkeep_s=upkeep)
            seconds, emitted, speculative, unseen = seconds + step, emitted + spec_tokens, speculative + 1, spec_tokens
            switching = True
        else:
            step = PLAIN + (switch_seconds if switching else 0.0)
            gov.record(member=None, tokens=1, seconds=step)
            seconds, emitted, unseen, switching = seconds + step, emitted + 1, unseen + 1, False
    return seconds, speculative


def test_a_speculator_that_never_lands_a_draft_costs_a_request_at_most_the_loss_budget():
    """Each step of a useless head costs four plain steps and emits one token. Its first step ever measures it;
    from then on every request of 64 tokens or more decodes inside the loss budget (1 %, half the 0.98x promise),
    and the head still gets probed now and then (the budget a long request earns)."""
    gov = ChainGovernor()
    first, _ = _request(gov, 64, spec_seconds=4 * PLAIN)
    assert first <= 64 * PLAIN * BUDGET + 3 * PLAIN  # the budget, and the one step that measured the head
    for tokens in (64, 100, 300, 1000):
        seconds, speculative = _request(gov, tokens, spec_seconds=4 * PLAIN)
        assert seconds <= tokens * PLAIN * BUDGET
    assert speculative > 1 and gov.members[0].expected_loss(PLAIN) == pytest.approx(3 * PLAIN)


def test_the_plain_step_after_a_probe_is_charged_to_the_probe():
    """The plain step right after a useless head's step runs 1.5 plain steps slower (the switch back): the governor
    charges it to the head, whose expected loss holds it, so every request still decodes inside the budget;
    uncharged, the same head costs a request more than its budget."""
    charged = ChainGovernor()
    _request(charged, 64, spec_seconds=2 * PLAIN, switch_seconds=1.5 * PLAIN)
    for tokens in (64, 100, 300, 1000):
        seconds, speculative = _request(charged, tokens, spec_seconds=2 * PLAIN, switch_seconds=1.5 * PLAIN)
        assert seconds <= tokens * PLAIN * BUDGET
    assert speculative > 1
    assert charged.members[0].expected_loss(PLAIN) == pytest.approx(2.5 * PLAIN)


def test_a_winning_speculator_speculates_from_a_requests_first_step():
    gov = ChainGovernor()
    _request(gov, 64, spec_seconds=1.2 * PLAIN, spec_tokens=4, row_seconds=0.1 * PLAIN)
    gov.new_request(prompt_rows=1000)  # a long prompt to catch up on: its wins pay for it
    assert gov.speculate() and gov.members[0].expected_loss(PLAIN) == 0.0
    seconds, _ = _request(gov, 64, spec_seconds=1.2 * PLAIN, spec_tokens=4)
    assert seconds < 0.5 * 64 * PLAIN


@pytest.mark.parametrize("row_seconds", [0.005 * PLAIN, 0.1 * PLAIN])
def test_a_useless_heads_probes_stay_in_the_budget_whatever_their_width_and_catch_up_cost(row_seconds):
    """A head that never lands: a step at one proposal costs two plain steps, at full width six, and its catch-up
    `row_seconds` a row it missed (the prompt's 30, then every token since it last proposed). It proposes one token a
    step, and the budget expects the catch-up of every row it missed: each request after the one that measured it
    decodes inside the budget. A catch-up cheaper than the budget's 1 % of a plain step a row is still probed in a
    long request; a dearer one never pays for a re-probe."""
    gov = ChainGovernor()
    request = dict(spec_seconds=2 * PLAIN, wide_seconds=6 * PLAIN, row_seconds=row_seconds, prompt=30)
    _request(gov, 64, **request)
    probes = 0
    for tokens in (64, 100, 300, 1000):
        seconds, speculative = _request(gov, tokens, **request)
        assert seconds <= tokens * PLAIN * BUDGET
        probes += speculative
    assert (probes > 0) == (row_seconds < (BUDGET - 1) * PLAIN)


def test_a_speculator_proposes_one_token_until_a_draft_of_its_lands():
    gov = ChainGovernor()
    _through_baseline(gov)
    assert gov.width_cap() == 1  # its first step ever
    gov.record(member=0, tokens=1, seconds=PLAIN, accepted=0)
    assert gov.speculate() and gov.width_cap() == 1
    gov.record(member=0, tokens=2, seconds=PLAIN, accepted=1)
    assert gov.width_cap() is None
