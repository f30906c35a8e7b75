"""The live bench's report: a bad minute and a growing RSS must show, not average away; a bare K=0 must not mislead."""

from __future__ import annotations

import pytest

from app.bench.live_mode import minute_windows
from app.bench.report import largest_k_text, windows_lines


def _run(seconds: int, fps: int = 10):
    """Messages at ``fps`` for ``seconds``: 50 ms latency, 400 ms during 70–80 s, 3 drops at 130 s."""
    arrivals = []
    for i in range(seconds * fps):
        t = i / fps
        latency = 0.4 if 70 <= t < 80 else 0.05
        payload = {"captured_at": 1000.0 + t, "published_at": 1000.0 + t + latency,
                   "latency_ms": {"infer": 300.0 if 70 <= t < 80 else 40.0},
                   "dropped_before": 3 if i == 130 * fps else 0}
        arrivals.append((payload, 500.0 + t + latency))
    rss = [(500.5 + t, (200 + t // 60 * 10) * 2**20) for t in range(0, seconds, 1)]
    return arrivals, rss


def test_each_minute_has_its_own_p99_drops_and_rss():
    windows = minute_windows(*_run(170))
    assert [w["start_s"] for w in windows] == [0, 60, 120]
    assert [w["messages"] for w in windows] == [600, 600, 500]
    assert windows[0]["p99_ms"] == 50.0 and windows[1]["p99_ms"] == 400.0
    assert [w["infer_p50_ms"] for w in windows] == [40.0, 40.0, 40.0]  # a median: 10 slow seconds do not move it
    assert [w["drops"] for w in windows] == [0, 0, 3]
    assert [w["rss_mb"] for w in windows] == [200.0, 210.0, 220.0]


def test_a_last_window_under_half_a_minute_is_left_out():
    assert len(minute_windows(*_run(140))) == 2


def test_the_report_line_names_the_worst_minute_and_the_rss_trend():
    live = {"steps": [{"k": 8, "runs": [{"windows": minute_windows(*_run(170))}]}, {"k": 1, "runs": [{}]}]}
    [line] = windows_lines(live)
    assert "K=8" in line and "3 minutes" in line
    assert "p99 50–400 ms (worst from 60 s)" in line
    assert "drops per minute at most 3" in line
    assert "200.0 MB in the first minute, 220.0 MB in the last" in line
    assert line.endswith("median infer (submit to result, waits included) per minute: 40, 40, 40")


def test_a_run_where_every_k_dropped_says_so_instead_of_k_0():
    assert largest_k_text({"max_k_no_drops": 0, "steps": [{"k": 8}]}) == "none of K = 8"
    assert largest_k_text({"max_k_no_drops": 6, "steps": [{"k": 6}, {"k": 8}]}) == "6"


def test_cpu_per_frame_tells_a_slower_host_from_waiting():
    """Worker CPU 2 cores-worth per second for 2 minutes, then 20 % more per frame: only the last minute rises."""
    arrivals, rss = _run(170)

    def cpu_between(t0: float, t1: float) -> float:
        def cpu_at(t: float) -> float:  # cumulative CPU seconds; 1.2x the rate from 620 s (120 s into the run)
            return 0.04 * 10 * (min(t, 620.0) - 500.0) + 1.2 * 0.04 * 10 * max(0.0, t - 620.0)
        return cpu_at(t1) - cpu_at(t0)

    windows = minute_windows(arrivals, rss, cpu_between)
    cpu = [w["cpu_ms_per_frame"] for w in windows]
    assert cpu[0] == pytest.approx(40.0, abs=0.05) and cpu[1] == pytest.approx(40.0, abs=0.05)  # 0.4 CPU s/s, 10 fps
    assert 47 < cpu[2] < 48.5  # the 20 % more per frame of the last minute (its first 0.05 s at the old rate)
    assert [w["infer_p50_ms"] for w in windows] == [40.0, 40.0, 40.0]
    [line] = windows_lines({"steps": [{"k": 8, "runs": [{"windows": windows}]}]})
    assert "worker CPU ms per frame per minute: 40" in line


def test_windows_without_cpu_samples_leave_the_column_out():
    windows = minute_windows(*_run(170))
    assert all(w["cpu_ms_per_frame"] is None for w in windows)
    [line] = windows_lines({"steps": [{"k": 8, "runs": [{"windows": windows}]}]})
    assert "worker CPU" not in line
