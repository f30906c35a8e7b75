"""Decimation by time and realtime pacing, with a fake clock and a fake sleep."""

from __future__ import annotations

import random

import pytest

from app.sources.pacing import Decimator, RealtimePacer


def admitted(decimator: Decimator, times: list[float]) -> list[float]:
    return [t for t in times if decimator.admit(t)]


@pytest.mark.parametrize(("source_fps", "max_fps", "expected_fps"), [
    (10, 5, 5), (30, 10, 10), (15, 10, 10), (25, 10, 10), (12, 10, 10), (10, 10, 10), (5, 10, 5), (30, 1, 1),
])
def test_decimation_holds_the_rate_for_constant_frame_rates(source_fps, max_fps, expected_fps):
    times = [i / source_fps for i in range(source_fps * 20)]
    kept = admitted(Decimator(max_fps), times)
    assert abs(len(kept) - expected_fps * 20) <= 1


def test_decimation_holds_the_rate_for_a_variable_frame_rate():
    rng = random.Random(3)
    times, t = [], 0.0
    for _ in range(2000):
        t += rng.choice([1 / 30, 1 / 15, 1 / 60, 0.1])
        times.append(t)
    kept = admitted(Decimator(5), times)
    assert len(kept) / (times[-1] - times[0]) == pytest.approx(5.0, rel=0.05)
    for start in range(int(times[-1]) - 1):
        assert sum(start <= t < start + 1 for t in kept) <= 6, "never more than max_fps + 1 in any second"


def test_arrival_jitter_does_not_halve_a_stream_already_at_max_fps():
    rng = random.Random(5)
    times = [i / 10 + rng.uniform(-0.015, 0.015) for i in range(300)]
    kept = admitted(Decimator(10), times)
    assert len(kept) >= 295


def test_decimation_restarts_when_time_jumps_back_like_a_loop_restart():
    decimator = Decimator(5)
    first = admitted(decimator, [i / 10 for i in range(60)])
    second = admitted(decimator, [i / 10 for i in range(60)])
    assert len(first) == len(second) == 30
    assert second[0] == 0.0


def test_no_limit_or_no_timestamp_admits_everything():
    assert all(Decimator(None).admit(t) for t in (0.0, 0.0, 0.001))
    assert all(Decimator(5).admit(None) for _ in range(10))


class FakeTime:
    """A clock that only moves when the pacer sleeps."""

    def __init__(self) -> None:
        self.now = 50.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.sleeps.append(seconds)
        self.now += seconds
        return False


def test_pacing_releases_each_frame_at_its_pts_relative_time():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock)
    released = []
    for i in range(10):
        assert pacer.wait(i / 10, fake.sleep)
        released.append(fake.now - 50.0)
    assert released == pytest.approx([i / 10 for i in range(10)])


def test_a_loop_restart_keeps_the_cadence_instead_of_sending_two_frames_at_once():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock)
    for i in range(5):  # a 5-fps clip of five frames, then its second pass
        pacer.wait(i * 0.2, fake.sleep)
    last = fake.now
    pacer.reset()  # what the decoder does when it reopens the file
    pacer.wait(0.0, fake.sleep)
    assert fake.now - last == pytest.approx(0.2), "the first frame of the next pass comes one interval later"
    pacer.wait(0.2, fake.sleep)
    assert fake.now - last == pytest.approx(0.4)


def test_pts_going_back_without_a_reset_also_keeps_the_cadence():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock)
    for pts in (10.0, 10.1, 10.2):
        pacer.wait(pts, fake.sleep)
    last = fake.now
    pacer.wait(0.0, fake.sleep)  # pts went back: the stream restarted its clock
    assert fake.now - last == pytest.approx(0.1)


def test_pacing_reanchors_when_far_behind():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock, max_lag_s=1.0)
    pacer.wait(0.0, fake.sleep)
    pacer.wait(5.0, fake.sleep)
    assert fake.now == pytest.approx(55.0)
    fake.now += 3.0  # the consumer stalled for 3 s
    pacer.wait(0.1, fake.sleep)
    pacer.wait(0.2, fake.sleep)
    assert fake.sleeps[-1] == pytest.approx(0.1), "no burst to catch up after a long stall"


def test_pacing_returns_false_when_the_sleep_is_interrupted_by_stop():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock)
    pacer.wait(0.0, fake.sleep)
    assert pacer.wait(1.0, lambda seconds: True) is False


def test_a_forward_timestamp_jump_reanchors_instead_of_sleeping_for_hours():
    fake = FakeTime()
    pacer = RealtimePacer(fake.clock, max_gap_s=5.0)
    pacer.wait(0.0, fake.sleep)
    pacer.wait(0.1, fake.sleep)
    pacer.wait(36000.1, fake.sleep)  # a 10-hour discontinuity in the stream's clock
    assert fake.now == pytest.approx(50.2)  # one frame interval after the frame before it, not 10 hours
    pacer.wait(36000.2, fake.sleep)
    assert fake.sleeps[-1] == pytest.approx(0.1), "after the jump, frames are paced from the new anchor"
