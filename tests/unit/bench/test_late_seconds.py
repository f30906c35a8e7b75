"""A long live run's late seconds, each with its cause: the host slower, other processes, or the pipeline itself."""

from __future__ import annotations

import pytest

from app.bench.common import WorkerRun
from app.bench.late_seconds import late_text, second_by_second
from app.bench.report import windows_lines

FPS = 10
SLOW = (27.0, 35.0)  # the host: each frame costs 1.3x the CPU
BUSY = (57.0, 63.0)  # another process takes one core
LATE = {30, 31, 32, 33, 34, 60, 61, 62, 90, 91}  # seconds whose frames are published 300 ms after capture


def _arrivals(seconds: int = 120, late: set[int] = LATE) -> list[tuple[dict, float]]:
    arrivals = []
    for i in range(seconds * FPS):
        t = 500.0 + i / FPS
        latency = 0.3 if int(t - 500.0) in late else 0.05
        arrivals.append(({"captured_at": 1000.0 + t - 500.0 - latency, "published_at": 1000.0 + t - 500.0,
                          "dropped_before": 2 if i == 31 * FPS else 0}, t))
    return arrivals


def _cumulative(rate, segments):
    """CPU seconds since 500 s: ``rate`` cores, and ``extra`` more cores inside each (lo, hi) of ``segments``."""
    def at(t: float) -> float:
        total = rate * (t - 500.0)
        for (lo, hi), extra in segments:
            total += extra * max(0.0, min(t, 500.0 + hi) - (500.0 + lo))
        return total
    return lambda t0, t1: at(t1) - at(t0)


CPU = _cumulative(0.4, [(SLOW, 0.12)])  # 40 ms per frame at 10 fps, 52 ms in the slow stretch
BACKGROUND = _cumulative(0.0, [(BUSY, 1.0)])


def test_each_late_second_is_attributed_to_what_the_seconds_before_it_show():
    anatomy = second_by_second(_arrivals(), CPU, BACKGROUND)
    assert anatomy["seconds"] == 120
    assert anatomy["cpu_ms_per_frame_median"] == pytest.approx(40.0)
    causes = {row["t_s"]: row["cause"] for row in anatomy["late"]}
    assert set(causes) == LATE
    assert {causes[s] for s in (30, 31, 32, 33, 34)} == {"host slower"}
    assert {causes[s] for s in (60, 61, 62)} == {"other processes"}
    assert {causes[s] for s in (90, 91)} == {"neither"}
    assert anatomy["causes"] == {"host slower": 5, "other processes": 3, "neither": 2}
    assert anatomy["late_drops"] == 2
    row = next(r for r in anatomy["late"] if r["t_s"] == 32)
    assert row["cpu_ms_per_frame"] == pytest.approx(52.0) and row["frames"] == FPS and row["p99_ms"] == 300.0
    assert anatomy["series"]["background_cores"][61] == pytest.approx(1.0)


def test_a_one_second_host_hiccup_too_short_for_the_3_s_average_still_makes_the_host_slower():
    hiccup = _cumulative(0.4, [((44.0, 45.0), 0.08)])  # one second at 48 ms per frame: +7 % over 3 s
    anatomy = second_by_second(_arrivals(late={45, 46, 90}), hiccup, BACKGROUND)
    rows = {row["t_s"]: row for row in anatomy["late"]}
    assert rows[45]["cpu_ms_per_frame"] < 1.1 * 40.0  # the 3-s rule alone would say "neither"
    assert rows[45]["worst_second_cpu_ms"] == pytest.approx(48.0)
    assert anatomy["series"]["cpu_ms_per_frame_1s"][44] == pytest.approx(48.0)
    assert {rows[45]["cause"], rows[46]["cause"]} == {"host slower"}
    assert rows[90]["cause"] == "neither"  # a second whose lookback had no slow second is still the pipeline's
    assert anatomy["causes"] == {"host slower": 2, "neither": 1}


def test_a_run_with_no_late_second_says_so_and_keeps_its_series():
    arrivals = [(dict(p, captured_at=p["published_at"] - 0.05), t) for p, t in _arrivals(60)]
    anatomy = second_by_second(arrivals, CPU, BACKGROUND)
    assert anatomy["late_seconds"] == 0 and anatomy["late"] == [] and anatomy["causes"] == {}
    assert len(anatomy["series"]["p99_ms"]) == 60 and anatomy["series"]["frames"][10] == FPS
    assert late_text(8, anatomy) == "K=8, second by second: 0 of 60 s had p99 > 150 ms; " \
                                    "a frame took a median 40.0 ms of worker CPU"


def test_the_report_gives_the_causes_after_the_minute_line():
    anatomy = second_by_second(_arrivals(), CPU, BACKGROUND)
    window = {"start_s": 0, "messages": 1200, "p99_ms": 300.0, "infer_p50_ms": 40.0, "cpu_ms_per_frame": 41.0,
              "drops": 2, "rss_mb": 290.0}
    lines = windows_lines({"steps": [{"k": 8, "runs": [{"windows": [window], "seconds": anatomy}]}]})
    assert len(lines) == 2
    assert lines[1].startswith("K=8, second by second: 10 of 120 s had p99 > 150 ms")
    assert "40–52 ms in the late seconds" in lines[1]
    assert "host slower 5, other processes 3, neither 2" in lines[1]
    assert lines[1].endswith("2 drops fell in late seconds")


def test_other_processes_cpu_is_the_machine_busy_time_less_the_workers():
    run = WorkerRun([], 0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0, False,
                    cpu_series=[(0.0, 0.0), (10.0, 15.0)], rss_series=[], messages=[], stderr_tail="",
                    busy_series=[(0.0, 100.0), (10.0, 118.0)])
    assert run.cpu_between(2.0, 4.0) == pytest.approx(3.0)
    assert run.background_between(2.0, 4.0) == pytest.approx(0.6)  # 3.6 busy - 3.0 the worker's
    assert WorkerRun([], 0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, False, [], [], [], "").background_between(0, 1) is None
