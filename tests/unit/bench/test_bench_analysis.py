"""The bench's arithmetic on messages it did not have to run a worker for: drops, latency, capacity, memory."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from app.bench import build_parser, make_plan
from app.bench import live_mode as live
from app.bench.file_mode import first_burst, throughput
from app.bench.report import capacity_lines, rows
from app.bench.results import BenchResult, Live, Machine, Spread
from app.bench.suite import Variant, memory_ks
from app.bench.worker import WorkerRun, memory_kb
from app.subscribe import DetectionMessage, Latency, StatusMessage

SETTINGS = live.LiveSettings(cameras=lambda k: [Path("clip.mkv")] * k, model_path=Path("m.onnx"),
                             backend="onnxruntime", fps=5.0, duration_s=8.0, p99_bound_ms=150.0)


def det(stream: str, seq: int, captured_at: float, latency_s: float = 0.05, dropped_before: int = 0,
        published_at: float | None = None) -> DetectionMessage:
    published = captured_at + latency_s if published_at is None else published_at
    return DetectionMessage(stream, seq, None, captured_at, published, 640, 480, dropped_before,
                            Latency(1.0, 2.0, 30.0, 1.0, latency_s * 1e3), "yolov3-tiny",
                            "onnxruntime:CPUExecutionProvider", ())


def status(stream: str, dropped: int) -> StatusMessage:
    return StatusMessage(stream, "running", "", 0, None, 0.0, 10, dropped)


def worker_run(detections, statuses=(), returncode=0) -> WorkerRun:
    return WorkerRun(["detstream", "run"], returncode, 9.0, False, 320.0, 300.0, "last words", list(detections),
                     list(statuses))


def test_spread_is_the_median_and_range_of_the_runs_that_gave_a_value():
    assert Spread.of([3.0, None, 1.0, float("nan"), 2.0]) == Spread(median=2.0, min=1.0, max=3.0,
                                                                      runs=[3.0, 1.0, 2.0])
    assert Spread.of([None]).median is None


def test_file_mode_counts_from_the_end_of_the_first_burst():
    times = [0.0, 0.001, 0.002, 0.5, 0.501, 1.0, 1.001]  # bursts of 3, 2 and 2 results
    assert first_burst(times) == 3
    dets = [det("clip", i, 0.0, published_at=t) for i, t in enumerate(times)]
    assert throughput(dets) == pytest.approx(4 / 1.001)


def test_a_live_run_leaves_out_the_warm_up_and_counts_drops_the_larger_way():
    warmup = SETTINGS.warmup_s
    dets = [det("cam00", 0, 100.0, latency_s=5.0)]  # inside the warm-up: its latency is not counted
    dets += [det("cam00", i, 100.0 + warmup + i * 0.2, dropped_before=1 if i == 3 else 0) for i in range(1, 11)]
    dets += [det("cam01", i, 100.0 + warmup + i * 0.2, latency_s=0.1) for i in range(1, 11)]
    statuses = [status("cam00", 0), status("cam01", 2)]  # cam01 dropped 2 frames after its last result
    run = live.analyse_live_run(worker_run(dets, statuses), 2, warmup)
    assert run.drops == 1 + 2
    assert run.p50_ms == pytest.approx(75.0) and run.p99_ms == pytest.approx(100.0)
    assert run.published_fps == pytest.approx(20 / 2.0)
    assert (run.peak_rss_mb, run.running_rss_mb) == (320.0, 300.0)


def test_a_live_run_that_failed_raises_with_the_workers_last_words():
    with pytest.raises(RuntimeError, match="last words"):
        live.analyse_live_run(worker_run([det("cam00", 0, 1.0)], returncode=2), 1, 0.0)


def _run(drops=0, p99=50.0, rss=300.0) -> live.LiveRun:
    return live.LiveRun("onnxruntime:CPUExecutionProvider", 5.0, 20.0, p99, drops, rss + 40, rss)


@pytest.mark.parametrize(("runs", "passed"), [([_run(), _run()], True), ([_run(), _run(drops=1)], False),
                                              ([_run(p99=151.0)], False)])
def test_a_step_passes_only_with_no_drops_in_any_repeat_and_the_p99_within_the_bound(runs, passed):
    assert live.summarize_step(2, runs, SETTINGS).passed is passed


def test_the_search_stops_at_the_first_failing_k_and_keeps_every_run(monkeypatch):
    tried = []

    def fake(settings, k):
        tried.append(k)
        return _run(drops=0 if k <= 4 else 3)

    monkeypatch.setattr(live, "run_live_once", fake)
    cache: live.RunCache = {}
    result = live.live_search(SETTINGS, [8, 1, 4, 6, 12], 1, cache, "fp32", "vtest")
    assert tried == [1, 4, 6]
    assert [s.k for s in result.steps] == [1, 4, 6] and result.max_cameras == 4
    assert sorted(cache) == [1, 4, 6]


def test_memory_reuses_the_searchs_runs_and_prices_one_more_camera(monkeypatch):
    made = []
    monkeypatch.setattr(live, "run_live_once", lambda settings, k: made.append(k) or _run(rss=300.0 + 10 * k))
    cache: live.RunCache = {1: [_run(rss=310.0)]}
    memory = live.run_memory(SETTINGS, 1, 8, 1, cache, "fp32")
    assert made == [8]
    assert memory.rss_per_camera_mb == pytest.approx((380.0 - 310.0) / 7, abs=0.05)
    assert memory.peak_rss_mb_high.median == 420.0


def test_the_workers_memory_is_read_from_proc():
    own = memory_kb(os.getpid())
    assert own["VmHWM"] >= own["VmRSS"] > 1000
    assert memory_kb(2**22 + 12345) == {}


def _opts(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(list(args))


def test_quick_makes_a_short_plan_whatever_else_was_asked():
    plan = make_plan(_opts("--quick", "--cameras", "4,8", "--repeat", "5"))
    assert (plan.repeats, plan.max_frames, plan.cameras, plan.live_duration_s) == (1, 40, [1, 2], 2.5)
    full = make_plan(_opts("--cameras", "8,2,2", "--clip", "vtest,bikes"))
    assert (full.cameras, full.clips, full.repeats) == ([2, 8], ["vtest", "bikes"], 3)


def test_memory_uses_the_largest_k_the_search_ran_else_the_largest_asked_for():
    plan = make_plan(_opts("--cameras", "2,4,8"))
    variant = Variant("fp32", Path("m.onnx"), None, None)
    assert memory_ks(plan, variant) == (2, 8)
    variant.live_runs.update({2: [_run()], 4: [_run()]})
    assert memory_ks(plan, variant) == (2, 4)
    assert memory_ks(make_plan(_opts("--cameras", "1")), Variant("fp32", Path("m.onnx"), None, None)) == (1, 2)


@pytest.mark.parametrize("args", [("--only", "model,gpu"), ("--cameras", "0,2"), ("--clip", ",")])
def test_options_that_cannot_run_are_refused(args):
    with pytest.raises(ValueError):
        make_plan(_opts(*args))


def test_the_result_round_trips_through_json_and_feeds_the_table():
    machine = Machine(cpu="cpu", cpu_flags=[], logical_cpus=2, memory_gb=8.0, os="Linux", python="3.11",
                      onnxruntime="1.20", providers=["CPUExecutionProvider"], commit="abc")
    result = BenchResult(started_at=1.0, quick=True, machine=machine)
    result.live.append(Live(precision="fp32", clip="vtest", engine="onnxruntime:CPUExecutionProvider",
                            fps_per_camera=5.0, duration_s=8.0, p99_bound_ms=150.0,
                            steps=[live.summarize_step(1, [_run()], SETTINGS)], max_cameras=1))
    back = BenchResult.model_validate_json(result.model_dump_json())
    assert back == result
    assert [r[0] for r in rows(back)] == ["live, 1 x 5 fps"] and rows(back)[0][-1] == "pass"
    assert capacity_lines(back) == ["capacity (fp32, onnxruntime:CPUExecutionProvider): 1 cameras of 5 fps with "
                                    "0 drops and p99 <= 150 ms (searched K = 1, 8 s each)"]
