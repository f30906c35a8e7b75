"""ViewSink: pictures only for watched sources, at most view_fps, and never a wait on the postprocess thread."""

from __future__ import annotations

import time

import numpy as np

from app.http.view import WATCH_HOLD_S, ViewSink
from app.types import Detections, FrameMeta, FrameResult, Letterbox


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def result(stream: str, seq: int, t: float, image: bool = True) -> FrameResult:
    meta = FrameMeta(stream, seq, None, time.time(), t - 0.02, 0.0, Letterbox(1.0, 0, 0, 32, 24),
                     image=np.zeros((24, 32, 3), np.uint8) if image else None)
    return FrameResult(meta, Detections.empty(), 1.0, 1.0)


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.01)
    return predicate()


def test_nothing_is_drawn_for_a_source_nobody_watches_and_its_rates_are_still_known():
    clock = Clock()
    sink = ViewSink(lambda: ("person",), view_fps=5, clock=clock)
    sink.start()
    try:
        for seq in range(20):
            clock.now += 0.1
            sink.submit(result("a", seq, clock.now), lossless=False)
        time.sleep(0.1)
        assert sink.picture("a") is None
        rates = sink.rates("a")
        assert 9.5 < rates.fps < 10.5 and rates.p50_ms == rates.p99_ms == 20.0
    finally:
        sink.close(5)


def test_a_watched_source_gets_at_most_view_fps_pictures_and_stops_after_the_hold():
    clock = Clock()
    sink = ViewSink(lambda: ("person",), view_fps=5, clock=clock)
    sink.start()
    try:
        sink.touch("a")
        taken = []
        for seq in range(20):  # two seconds at 10 fps
            clock.now += 0.1
            sink.submit(result("a", seq, clock.now), lossless=False)
            assert wait_for(lambda: sink.waiting == 0)  # let the drawing thread catch up
            picture = sink.picture("a")
            if picture is not None and (not taken or taken[-1] != picture.number):
                taken.append(picture.number)
        assert 8 <= len(taken) <= 10, taken  # 5 a second
        assert sink.picture("a").jpeg[:2] == b"\xff\xd8"
        clock.now += WATCH_HOLD_S + 1
        last = sink.picture("a").number
        sink.submit(result("a", 99, clock.now), lossless=False)
        time.sleep(0.1)
        assert sink.picture("a").number == last, "no longer watched: not drawn"
        sink.watch("a")
        clock.now += 1
        sink.submit(result("a", 100, clock.now), lossless=False)
        assert wait_for(lambda: sink.picture("a").seq == 100)
        sink.unwatch("a")
        sink.forget("a")
        assert sink.picture("a") is None
    finally:
        sink.close(5)


def test_submit_returns_at_once_while_drawing_is_stuck():
    clock = Clock()

    def slow_names():
        time.sleep(1.0)
        return ("person",)

    sink = ViewSink(slow_names, view_fps=30, clock=clock)
    sink.start()
    try:
        sink.watch("a")
        started = time.monotonic()
        for seq in range(100):
            clock.now += 0.05
            sink.submit(result("a", seq, clock.now), lossless=True)
        assert time.monotonic() - started < 0.5
    finally:
        sink.close(5)
