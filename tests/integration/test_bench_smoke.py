"""``detstream bench --quick``: every section runs and lands in the JSON with sane numbers.

A smoke test only: the figures of a quick run on a shared CI machine mean
nothing, so no performance target is asserted here (BENCHMARKS.md has them).
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tests.conftest import detstream

pytestmark = pytest.mark.slow


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value) -> bool:
    return _finite(value) and value > 0


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory, default_model, vtest):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = detstream("bench", "--quick", "--json", str(out), timeout_s=90)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_quick_bench_writes_every_section(quick_results):
    for section in ("machine", "model_only", "naive", "file", "live", "memory", "ratios", "targets"):
        assert section in quick_results, section
    assert quick_results["errors"] == {}


def test_machine_names_cpu_cores_and_onnxruntime(quick_results):
    machine = quick_results["machine"]
    assert machine["cpu"] and machine["onnxruntime"]
    assert machine["physical_cores"] >= 1
    assert "CPUExecutionProvider" in machine["providers"]


@pytest.mark.parametrize("batch", ["1", "2", "4", "8"])
def test_model_only_has_every_pipeline_batch_size(quick_results, batch):
    entry = quick_results["model_only"]["batches"][batch]
    assert _positive(entry["fps"]["median"])
    assert _positive(entry["ms_per_batch"]["median"])
    assert entry["fps"]["min"] <= entry["fps"]["median"] <= entry["fps"]["max"]


def test_postprocess_time_is_reported_next_to_inference(quick_results):
    post = quick_results["model_only"]["postprocess"]
    assert post["batch"] == 8
    assert _positive(post["real_ms"]["median"]) and _positive(post["infer_ms_same_batch"])


def test_naive_and_file_mode_report_fps_on_the_clip(quick_results):
    assert _positive(quick_results["naive"]["vtest"]["fps"]["median"])
    file_mode = quick_results["file"]["vtest"]
    assert _positive(file_mode["fps"]["median"])
    assert _positive(file_mode["wall_s"]["median"])
    assert file_mode["lossless"] is True
    assert file_mode["messages"] == 40
    for stage in ("decode", "queue", "infer", "post", "total"):
        assert _finite(file_mode["stages_ms"][stage]["p50"])


def test_ratios_compare_file_mode_with_model_only_and_naive(quick_results):
    ratio = quick_results["ratios"]["vtest"]
    assert _positive(ratio["e2e_over_model_only"]["median"])
    assert _positive(ratio["e2e_over_model_only_best"]["median"])
    assert _positive(ratio["e2e_over_naive"]["median"])
    assert str(ratio["model_only_batch"]) in quick_results["model_only"]["batches"]


def test_model_only_runs_on_the_input_size_the_pipeline_feeds(quick_results):
    entry = quick_results["model_only_by_clip"]["vtest"]
    assert entry["rect"] is True and entry["input_hw"] == [320, 416]  # 768x576 letterboxed to 416x312, padded to 32
    assert entry["in_flight"] >= 2


def test_live_steps_have_latency_percentiles_and_drops(quick_results):
    live = quick_results["live"]
    assert [s["k"] for s in live["steps"]] == [1, 2]
    for step in live["steps"]:
        for key in ("p50_ms", "p95_ms", "p99_ms"):
            assert _positive(step[key]["median"]), (step["k"], key)
        assert step["p50_ms"]["median"] <= step["p99_ms"]["median"]
        assert _finite(step["drops_total"]["median"]) and step["drops_total"]["median"] >= 0
    assert live["max_k_no_drops"] >= 0
    overload = live["overload"]
    assert _positive(overload["p99_ms"]["median"])
    assert overload["drops_per_camera"]["min"] <= overload["drops_per_camera"]["max"]


def test_memory_reports_peak_rss_and_rss_per_stream(quick_results):
    memory = quick_results["memory"]
    assert _positive(memory["peak_rss_mb_low"]["median"])
    assert _positive(memory["peak_rss_mb_high"]["median"])
    assert _finite(memory["rss_per_stream_mb"])


def test_memory_bounds_each_peak_with_the_whole_frame_ring_resident(quick_results):
    memory = quick_results["memory"]
    slot_mb = 3 * 416 * 416 * 4 / 2**20  # one float32 frame at the default model's full input
    for key in ("low", "high"):
        k = memory[f"{key}_k"]
        slots = max(3, math.ceil(2 * 8 / k)) * k  # two batches of the default max_batch 8, 3 per stream at least
        assert memory[f"ring_mb_{key}"] == pytest.approx(slots * slot_mb, abs=0.05)
        running = memory[f"steady_peak_rss_mb_{key}"]["median"] + memory[f"ring_mb_{key}"]
        assert memory[f"worst_rss_mb_{key}"] == pytest.approx(max(memory[f"peak_rss_mb_{key}"]["median"], running),
                                                              abs=0.1)


def test_model_only_says_how_close_it_computes_to_the_cores_peak(quick_results):
    sgemm = quick_results["machine"]["sgemm_gflops_one_thread"]
    model_only = quick_results["model_only"]
    assert _positive(sgemm)
    assert model_only["gflop_per_frame"] == pytest.approx(5.565 * 320 / 416, rel=0.01)  # vtest runs at 416x320
    for entry in model_only["batches"].values():
        # GFLOP per CPU-second: well above a naive loop's few GFLOP/s, and a core cannot beat its SGEMM by 2x
        assert 5 < entry["gflops_per_core"] < 2 * sgemm


@pytest.fixture(scope="module")
def int8_results(tmp_path_factory, default_model, vtest, bikes):
    """``--int8`` on both clips with a copy of the default model, so the INT8 file lands beside the copy."""
    work = tmp_path_factory.mktemp("bench-int8")
    model = work / "yolov3-tiny.onnx"
    shutil.copyfile(default_model, model)
    out = work / "int8.json"
    proc = detstream("bench", "--quick", "--int8", "--only", "model", "--clip", "vtest,bikes", "--model", str(model),
                     "--cache-dir", str(work / "cache"), "--json", str(out), timeout_s=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, json.loads(out.read_text())


def test_int8_reports_speed_and_agreement_on_every_clip(int8_results):
    work, results = int8_results
    int8 = results["int8"]
    assert (work / "yolov3-tiny-int8.onnx").is_file()  # made on the first clip, as it was missing
    assert _positive(int8["speedup_model_only"])
    assert (int8["clip"], int8["input_hw"]) == ("vtest", [320, 416])  # the label, as the fp32 rows have it
    from app.bench.report import throughput_rows

    labels = {row[1] for row in throughput_rows(results) if row[0].startswith("INT8 model-only")}
    assert labels == {"vtest (320x416)"}
    by_clip = int8["agreement_by_clip"]
    assert list(by_clip) == ["vtest", "bikes"]
    assert by_clip["vtest"]["own_calibration"] == by_clip["vtest"]["bench_model"]  # calibrated on vtest already
    assert by_clip["vtest"]["bench_model"]["calibrated_on"] == "vtest.avi"
    own = by_clip["bikes"]["own_calibration"]
    assert own["calibrated_on"] == "bikes.mp4" and own["model"].startswith(str(work / "cache"))
    for entry in by_clip.values():
        assert 0 <= entry["own_calibration"]["f1"] <= 1 and entry["own_calibration"]["reference_detections"] > 0
    rows = {row["name"]: row for row in results["targets"]}
    for label in ("vtest", "bikes"):
        row = rows[f"INT8 F1 vs fp32, {label} (calibrated on its own footage)"]
        assert row["value"] == by_clip[label]["own_calibration"]["f1"] and isinstance(row["pass"], bool)
