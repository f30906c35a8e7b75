"""Backoff: exponential caps, full-jitter bounds, reset after a stable period (fake RNG and clock)."""

from __future__ import annotations

import random

import pytest

from app.config import BackoffConfig
from app.sources.backoff import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def highest(low: float, high: float) -> float:
    return high


@pytest.mark.parametrize(("initial_s", "max_s", "multiplier", "expected"), [
    (0.5, 30.0, 2.0, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]),
    (1.0, 5.0, 3.0, [1.0, 3.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]),
    (0.2, 0.2, 2.0, [0.2] * 9),
    (0.5, 30.0, 1.0, [0.5] * 9),
])
def test_the_delay_caps_grow_geometrically_up_to_the_maximum(initial_s, max_s, multiplier, expected):
    backoff = Backoff(initial_s, max_s, multiplier, rng=highest)
    assert [backoff.next_delay() for _ in expected] == pytest.approx(expected)
    assert backoff.attempt == len(expected)


def test_full_jitter_stays_between_zero_and_the_cap():
    backoff = Backoff(0.5, 30.0, rng=random.Random(7).uniform)
    delays = [backoff.next_delay() for _ in range(200)]
    for failures, delay in enumerate(delays):
        assert 0.0 <= delay <= backoff.cap_s(failures)
    late = delays[10:]
    assert min(late) < 10 < max(late), "full jitter spreads over the whole range"


def test_a_huge_attempt_count_does_not_overflow():
    backoff = Backoff(0.5, 30.0, rng=highest)
    for _ in range(5000):
        delay = backoff.next_delay()
    assert delay == 30.0


def test_running_for_the_stable_period_resets_the_next_delay():
    clock = FakeClock()
    backoff = Backoff(0.5, 30.0, reset_after_s=30.0, rng=highest, clock=clock)
    assert [backoff.next_delay() for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    backoff.running()
    clock.now += 29.0
    assert backoff.next_delay() == 8.0, "a short run does not reset"
    backoff.running()
    clock.now += 30.0
    assert backoff.next_delay() == 0.5
    assert backoff.attempt == 1


def test_a_failure_without_a_new_run_does_not_use_an_old_run_for_the_reset():
    clock = FakeClock()
    backoff = Backoff(0.5, 30.0, reset_after_s=30.0, rng=highest, clock=clock)
    backoff.running()
    backoff.next_delay()
    clock.now += 100.0
    assert backoff.next_delay() == 1.0


def test_from_config_uses_the_config_defaults():
    backoff = Backoff.from_config(BackoffConfig(), rng=highest)
    assert (backoff.initial_s, backoff.max_s, backoff.multiplier, backoff.reset_after_s) == (0.5, 30.0, 2.0, 30.0)
