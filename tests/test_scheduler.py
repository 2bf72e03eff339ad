"""The K/S guard and the adaptive controller, driven round by round."""

from __future__ import annotations

import pytest

from power.runtime.scheduler import Scheduler, SchedulerConfig, Shape


def test_s_at_least_k_asks_for_k_every_round():
    sched = Scheduler(SchedulerConfig(k=7, s=7))
    assert not sched.config.guarded
    for accepted in (7, 0, 3):
        assert sched.width() == 7
        sched.record(proposed=7, accepted=accepted, replayed=False)
    assert (sched.clamps, sched.fallbacks) == (0, 0)


def test_guarded_path_clamps_to_s_after_the_first_replay_for_the_rest_of_the_request():
    sched = Scheduler(SchedulerConfig(k=7, s=6))
    assert sched.config.guarded
    assert sched.width() == 7
    sched.record(proposed=7, accepted=7, replayed=False)
    assert sched.width() == 7
    sched.record(proposed=7, accepted=0, replayed=True)
    assert sched.width() == 6 and sched.clamped and sched.clamps == 1
    sched.record(proposed=6, accepted=6, replayed=False)
    assert sched.width() == 6 and sched.clamps == 1


def test_adaptive_starts_narrow_and_a_fully_accepted_first_round_opens_k():
    sched = Scheduler(SchedulerConfig(k=10, s=6, adaptive=True))
    assert sched.shape is Shape.PROBING and sched.width() == 6
    sched.record(proposed=6, accepted=6, replayed=False)
    assert sched.shape is Shape.WIDE and sched.width() == 10


def test_adaptive_partial_first_round_closes_the_wide_path_for_the_request():
    sched = Scheduler(SchedulerConfig(k=10, s=6, adaptive=True))
    sched.record(proposed=6, accepted=4, replayed=False)
    assert sched.shape is Shape.NARROW
    for _ in range(5):
        sched.record(proposed=6, accepted=6, replayed=False)
        assert sched.width() == 6


def test_rounds_without_proposals_do_not_decide_the_first_round():
    sched = Scheduler(SchedulerConfig(k=4, s=4, adaptive=True))
    sched.record(proposed=0, accepted=0, replayed=False)
    assert sched.shape is Shape.PROBING
    sched.record(proposed=4, accepted=4, replayed=False)
    assert sched.shape is Shape.WIDE


def test_healthy_partial_rounds_keep_the_shape_and_low_yield_falls_back_one_way():
    sched = Scheduler(SchedulerConfig(k=8, s=8, adaptive=True, low_yield=0.25, low_yield_rounds=3))
    sched.record(proposed=8, accepted=8, replayed=False)
    for accepted in (5, 3, 0, 0, 4):  # a healthy round resets the low-yield run
        sched.record(proposed=8, accepted=accepted, replayed=False)
        assert sched.shape is Shape.WIDE
    sched.record(proposed=8, accepted=1, replayed=False)
    sched.record(proposed=8, accepted=0, replayed=False)
    assert sched.shape is Shape.WIDE
    sched.record(proposed=8, accepted=0, replayed=False)
    assert sched.shape is Shape.FALLBACK and sched.width() == 0 and sched.fallbacks == 1
    sched.record(proposed=8, accepted=8, replayed=False)
    assert sched.shape is Shape.FALLBACK and sched.fallbacks == 1


def test_adaptive_wide_shape_is_still_clamped_by_the_guard():
    sched = Scheduler(SchedulerConfig(k=7, s=3, adaptive=True))
    sched.record(proposed=3, accepted=3, replayed=False)
    assert sched.width() == 7
    sched.record(proposed=7, accepted=1, replayed=True)
    assert sched.width() == 3 and sched.shape is Shape.WIDE


@pytest.mark.parametrize("kwargs, field", [({"k": -1, "s": 1}, "K"), ({"k": 3, "s": 0}, "S")])
def test_invalid_settings_name_the_setting(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)
