"""The bench's INT8 agreement, per clip: the bench's model and one calibrated on each clip's own footage.

Real model, real clips, real quantization (8 calibration frames, to keep it short). What a reader of the
table relies on: every clip gets both figures, the own-calibration model is calibrated on that clip (and
cached, so a second bench run does not quantize again), and the target rows judge the own-calibration F1.
"""

from __future__ import annotations

import json

import onnx
import pytest

from app.bench.int8 import agreement_by_clip, own_calibration_model
from app.bench.report import targets, throughput_rows

pytestmark = pytest.mark.slow

CALIBRATION_FRAMES = 8
HELD_OUT = 6


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-cache")


@pytest.fixture(scope="module")
def vtest_int8(default_model, vtest, tmp_path_factory):
    from app.models.quantization.quantize import quantize_model

    return quantize_model(default_model, vtest, tmp_path_factory.mktemp("int8") / "m-int8.onnx",
                          frames=CALIBRATION_FRAMES)


@pytest.fixture(scope="module")
def by_clip(default_model, vtest_int8, vtest, bikes, cache):
    return agreement_by_clip(default_model, vtest_int8, {"vtest": vtest, "bikes": bikes}, HELD_OUT,
                             CALIBRATION_FRAMES, cache)


def test_every_clip_gets_both_figures_on_the_same_held_out_frames(by_clip, vtest, bikes):
    assert list(by_clip) == ["vtest", "bikes"]
    for clip, entry in zip((vtest, bikes), by_clip.values(), strict=True):
        own, bench = entry["own_calibration"], entry["bench_model"]
        assert own["calibrated_on"] == clip.name and bench["calibrated_on"] == vtest.name  # read from the files
        assert own["held_out_frames"] == bench["held_out_frames"] and len(own["held_out_frames"]) == HELD_OUT
        assert 0 <= own["f1"] <= 1 and 0 <= bench["f1"] <= 1
        assert own["reference_detections"] > 0  # fp32 found something, so the F1 means something
    assert by_clip["vtest"]["own_calibration"] == by_clip["vtest"]["bench_model"]  # calibrated on vtest already


def test_the_own_calibration_model_is_calibrated_on_that_clip_and_cached(default_model, bikes, cache, by_clip):
    path = by_clip["bikes"]["own_calibration"]["model"]
    assert str(path).startswith(str(cache)) and "bikes" in str(path)
    model = onnx.load(path, load_external_data=False)
    assert {p.key: p.value for p in model.metadata_props}["detstream.precision"] == "int8"
    before = cache.joinpath(path).stat().st_mtime_ns
    again = own_calibration_model(default_model, bikes, CALIBRATION_FRAMES, cache)
    assert str(again) == path and again.stat().st_mtime_ns == before  # not quantized a second time


def test_the_targets_judge_each_clip_on_its_own_calibration(by_clip):
    results = json.loads(json.dumps({"int8": {"speedup_model_only": 2.9, "agreement_by_clip": by_clip}}))
    rows = {row["name"]: row for row in targets(results)}
    for label in ("vtest", "bikes"):
        row = rows[f"INT8 F1 vs fp32, {label} (calibrated on its own footage)"]
        f1 = by_clip[label]["own_calibration"]["f1"]
        assert row["value"] == f1 and row["pass"] is (f1 >= 0.95)
    table = {(row[0], row[1]): row for row in throughput_rows({"machine": {}, **results})}
    bikes_row = table[("INT8 F1 against fp32", "bikes")]
    assert bikes_row[2] == f"{by_clip['bikes']['own_calibration']['f1']:.4f}"
    assert bikes_row[4].startswith("calibrated on bikes.mp4: ")
    assert f"calibrated on vtest.avi: F1 {by_clip['bikes']['bench_model']['f1']:.4f}" in bikes_row[4]


def test_a_bench_model_that_does_not_say_what_it_was_calibrated_on_is_not_taken_for_either_clip(
        default_model, vtest_int8, vtest, cache, tmp_path):
    unlabelled = tmp_path / "old-int8.onnx"
    model = onnx.load(str(vtest_int8))
    kept = [p for p in model.metadata_props if not p.key.startswith("detstream.calibrat")]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(unlabelled))
    entry = agreement_by_clip(default_model, unlabelled, {"vtest": vtest}, HELD_OUT, CALIBRATION_FRAMES,
                              cache)["vtest"]
    assert entry["bench_model"]["calibrated_on"] == "unknown"
    assert entry["own_calibration"]["calibrated_on"] == vtest.name and "model" in entry["own_calibration"]


def test_a_bench_model_calibrated_on_another_frame_count_is_not_reused_as_the_clips_own(
        default_model, vtest_int8, vtest, cache):
    """Its calibration frames are not the ones the agreement holds out, so the clip gets its own model."""
    entry = agreement_by_clip(default_model, vtest_int8, {"vtest": vtest}, HELD_OUT, CALIBRATION_FRAMES + 2,
                              cache)["vtest"]
    assert entry["bench_model"]["calibrated_on"] == vtest.name
    assert "model" in entry["own_calibration"] and f"calib{CALIBRATION_FRAMES + 2}" in entry["own_calibration"]["model"]
