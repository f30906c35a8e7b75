"""``detstream bench --quick`` end to end: what a user sizing a machine reads from it.

A smoke test only: the figures of a quick run on a shared CI machine mean
nothing, so no performance target is asserted here. What is asserted is what a
user relies on: the table is printed with every measurement and the capacity
line, the JSON reads back as the typed result, and the numbers in it are real.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from app.bench.report import COLUMNS
from app.bench.results import SCHEMA, BenchResult
from tests.conftest import detstream

pytestmark = pytest.mark.slow


def _positive(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick(tmp_path_factory, default_model, vtest):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = detstream("bench", "--quick", "--json", str(out), timeout_s=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, out


def test_the_table_names_every_measurement_and_the_capacity(quick):
    stdout, out = quick
    for column in COLUMNS:
        assert column in stdout, column
    for row in ("model-only, batch", "naive loop", "file mode", "live, 1 x 5 fps", "memory, 1 → 2 cameras"):
        assert row in stdout, row
    assert "capacity (fp32, openvino:CPU:" in stdout  # the default engine on a CPU: auto picks OpenVINO
    assert f"results: {out}" in stdout


def test_the_json_reads_back_as_the_typed_result(quick):
    _, out = quick
    raw = json.loads(out.read_text())
    assert raw["format"] == SCHEMA
    result = BenchResult.model_validate_json(out.read_text())
    assert result.errors == {} and result.interrupted is None and result.quick is True
    assert result.machine.logical_cpus >= 1 and "CPUExecutionProvider" in result.machine.providers
    assert [(m.precision, m.name, m.input_hw) for m in result.models] == [("fp32", "yolov3-tiny", (416, 416))]


def test_model_only_and_naive_give_positive_rates_on_the_clip(quick):
    result = BenchResult.model_validate_json(quick[1].read_text())
    (model_only,) = result.model_only
    assert model_only.clip == "vtest" and model_only.input_hw == (320, 416)  # the rectangle the pipeline feeds
    assert sorted(model_only.batches) == [1, 2, 4, 8]
    for rate in model_only.batches.values():
        assert _positive(rate.fps.median) and _positive(rate.ms_per_batch.median)
    assert model_only.best_fps == model_only.batches[model_only.best_batch].fps
    (naive,) = result.naive
    assert naive.clip == "vtest" and naive.frames == 40 and _positive(naive.fps.median)


def test_file_mode_is_lossless_and_compared_with_both_references(quick):
    result = BenchResult.model_validate_json(quick[1].read_text())
    (file_mode,) = result.file
    assert file_mode.lossless is True and file_mode.frames == 40
    assert file_mode.engine.startswith("openvino:CPU:")  # backend:device:precision, as the messages carry it
    for value in (file_mode.fps.median, file_mode.wall_s.median, file_mode.p50_ms.median, file_mode.p99_ms.median,
                  file_mode.peak_rss_mb.median, file_mode.of_model_only, file_mode.of_naive):
        assert _positive(value)
    assert file_mode.p50_ms.median <= file_mode.p99_ms.median


def test_the_live_search_reports_latency_drops_and_a_capacity(quick):
    result = BenchResult.model_validate_json(quick[1].read_text())
    (live,) = result.live
    assert live.fps_per_camera == 5 and live.p99_bound_ms == 150
    assert [s.k for s in live.steps][:1] == [1]
    for step in live.steps:
        assert _positive(step.p50_ms.median) and step.p50_ms.median <= step.p99_ms.median
        assert step.drops.median is not None and step.drops.median >= 0
        assert _positive(step.running_rss_mb.median) and _positive(step.peak_rss_mb.median)
    assert live.max_cameras == max([s.k for s in live.steps if s.passed], default=0)


def test_memory_reports_resident_memory_at_both_camera_counts(quick):
    result = BenchResult.model_validate_json(quick[1].read_text())
    (memory,) = result.memory
    assert (memory.low_k, memory.high_k) == (1, 2)
    for spread in (memory.peak_rss_mb_low, memory.peak_rss_mb_high, memory.running_rss_mb_low,
                   memory.running_rss_mb_high):
        assert 50 < spread.median < 4000  # MB: a real process, not bytes or GB
    assert memory.peak_rss_mb_high.median >= memory.running_rss_mb_high.median
    assert memory.rss_per_camera_mb is not None


def test_int8_makes_the_model_beside_the_fp32_one_and_runs_it_too(tmp_path, default_model, vtest):
    model = tmp_path / "yolov3-tiny.onnx"
    shutil.copyfile(default_model, model)
    out = tmp_path / "int8.json"
    proc = detstream("bench", "--quick", "--int8", "--only", "model", "--model", str(model), "--json", str(out),
                     timeout_s=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "yolov3-tiny-int8.onnx").is_file()
    result = BenchResult.model_validate_json(out.read_text())
    assert [m.precision for m in result.models] == ["fp32", "int8"]
    assert [(m.precision, m.clip) for m in result.model_only] == [("fp32", "vtest"), ("int8", "vtest")]
    assert all(_positive(m.best_fps.median) for m in result.model_only)


def test_engines_compares_backends_and_precisions_side_by_side(tmp_path, default_model, vtest):
    out = tmp_path / "engines.json"
    proc = detstream("bench", "--quick", "--only", "model,file", "--engines", "onnxruntime:fp32,openvino:fp32,auto",
                     "--json", str(out), timeout_s=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = BenchResult.model_validate_json(out.read_text())
    labels = ["onnxruntime:fp32", "openvino:fp32", "auto"]
    assert [m.precision for m in result.model_only] == labels
    assert [m.engine for m in result.model_only][:2] == ["onnxruntime:CPUExecutionProvider:fp32", "openvino:CPU:fp32"]
    assert [(f.precision, f.engine) for f in result.file] == [(m.precision, m.engine) for m in result.model_only]
    assert all(f.lossless and _positive(f.fps.median) for f in result.file)
