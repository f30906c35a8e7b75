"""DropReport: when an overload warning is due, and what it says."""

from __future__ import annotations

import itertools
import re

from app.stages.overload import DropReport


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _report(clock: Clock) -> DropReport:
    return DropReport("onnxruntime:CPUExecutionProvider", settle_s=10.0, interval_s=60.0, clock=clock)


def _publish(report: DropReport, clock: Clock, seconds: float, fps: float, drops_every: int = 0,
             streams: tuple[str, ...] = ("cam0", "cam1"), cpu_ms: float | None = None) -> None:
    """``seconds`` of frames at ``fps``, round-robin over ``streams``; every ``drops_every``-th frame follows a drop."""
    for i in range(round(seconds * fps)):
        clock.now += 1.0 / fps
        dropped = 1 if drops_every and i % drops_every == 0 else 0
        report.published(streams[i % len(streams)], dropped, infer_ms=88.0, cpu_ms=cpu_ms)


def test_no_drops_never_reports() -> None:
    clock = Clock()
    report = _report(clock)
    for _ in range(5):
        _publish(report, clock, 30, 20)
        assert report.due() is None


def test_drops_report_once_settled_with_counts_rate_and_advice() -> None:
    clock = Clock()
    report = _report(clock)
    _publish(report, clock, 5, 40, drops_every=4)  # 200 frames, 50 after a drop, for 5 s
    assert report.due() is None  # not settled: a start-up burst alone is no overload
    _publish(report, clock, 6, 40, drops_every=4)  # 240 more, 60 after a drop
    text = report.due()
    assert text is not None
    assert text.startswith("live sources dropped 110 frames in 11 s (cam0 110)")  # even frames go to cam0
    published = float(re.search(r"published ([\d.]+) frames/s", text).group(1))
    assert abs(published - 40.0) < 0.5
    offered = float(re.search(r"offered ([\d.]+) frames/s", text).group(1))
    assert abs(offered - 50.0) < 0.5  # 440 published + 110 dropped in 11 s
    assert "on onnxruntime:CPUExecutionProvider, a batch taking a median 88 ms from submit to result. " in text
    assert "inference CPU" not in text  # an engine that does not measure it: no CPU figure
    assert "max_fps" in text and "yolov3-tiny-int8" in text and 'reason="live_policy"' in text


def test_a_lasting_overload_reports_at_most_once_per_interval() -> None:
    clock = Clock()
    report = _report(clock)
    reports = []
    for _ in range(180):  # three minutes of drops, checked every second
        _publish(report, clock, 1, 20, drops_every=2)
        text = report.due()
        if text:
            reports.append((clock.now, text))
    assert len(reports) == 3
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(reports)]
    assert all(60 <= gap < 61.01 for gap in gaps), gaps  # checked once a second: the first check past 60 s
    for _, text in reports[1:]:  # each later report covers its own minute: 10 drops/s, not a running total
        dropped, seconds = map(int, re.search(r"dropped (\d+) frames in (\d+) s", text).groups())
        assert seconds in (60, 61) and dropped == 10 * seconds, text


def test_a_quiet_hour_does_not_dilute_the_rate_of_a_later_overload() -> None:
    clock = Clock()
    report = _report(clock)
    _publish(report, clock, 600, 5)  # ten quiet minutes at 5 frames/s
    assert report.due() is None
    _publish(report, clock, 12, 40, drops_every=2)
    text = report.due()
    assert text is not None
    published = float(re.search(r"published ([\d.]+) frames/s", text).group(1))
    assert published > 30, text


def test_the_report_gives_what_a_frame_cost_in_inference_cpu_when_the_engine_measures_it() -> None:
    clock = Clock()
    report = _report(clock)
    _publish(report, clock, 11, 40, drops_every=4, cpu_ms=43.2)
    text = report.due()
    assert text is not None
    assert "from submit to result, a frame 43 ms of inference CPU. To stop the drops" in text
