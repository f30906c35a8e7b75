"""OvEngine on the tiny model: the same outputs as numpy, rectangular inputs, workers, cache and close."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from engine_models import make_model, random_frames, reference

from app.engines.openvino import OvEngine, openvino_cache_dir
from app.errors import EngineError


@pytest.fixture
def engine(tmp_path: Path) -> OvEngine:
    spec = make_model(tmp_path / "tiny.onnx", None, dynamic_hw=True)
    ov = OvEngine(spec, "fp32", requests=2, cache_dir=tmp_path / "cache")
    yield ov
    ov.close()


def test_outputs_match_the_reference_in_fp32(engine: OvEngine) -> None:
    assert engine.backend == "openvino:CPU:fp32" and engine.batch_window is False
    frames = random_frames(2)
    for got, want in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_rectangular_size_compiles_once_and_computes_right(engine: OvEngine) -> None:
    assert engine.accepts_dynamic_hw
    frames = random_frames(2, height=4, width=8)
    for _ in range(2):
        got = engine.submit(list(frames)).wait()
        np.testing.assert_allclose(got[1], reference(frames)[1], rtol=1e-5)
    with pytest.raises(ValueError, match="multiples of 4"):
        engine.submit([np.zeros((3, 6, 8), np.float32)])


def test_the_warm_up_size_is_released_when_frames_use_another(engine: OvEngine) -> None:
    nominal = (engine.spec.input_height, engine.spec.input_width)
    engine.warmup()
    assert engine.compiled_sizes == (nominal,)
    rect = random_frames(2, height=4, width=8)
    engine.submit(list(rect)).wait()
    assert engine.compiled_sizes == ((4, 8),)
    square = random_frames(2)  # the nominal size is compiled again when a frame needs it, and then kept
    for got, want in zip(engine.submit(list(square)).wait(), reference(square), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(engine.submit(list(rect)).wait()[1], reference(rect)[1], rtol=1e-5)
    assert set(engine.compiled_sizes) == {nominal, (4, 8)}


def test_a_size_used_by_frames_stays_compiled(engine: OvEngine) -> None:
    engine.submit(list(random_frames(1))).wait()
    engine.submit(list(random_frames(1, height=4, width=8))).wait()
    assert len(engine.compiled_sizes) == 2


def test_the_compiled_model_cache_is_written(tmp_path: Path, engine: OvEngine) -> None:
    engine.warmup()
    assert any((tmp_path / "cache").iterdir())


def test_wait_for_room_never_queues_more_than_one_frame_per_worker(engine: OvEngine) -> None:
    stop = threading.Event()
    assert engine.wait_for_room(stop) == 2
    stop.set()
    assert engine.wait_for_room(stop) == 0


def test_submit_after_close_is_an_engine_error(engine: OvEngine) -> None:
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(EngineError, match="submit after close"):
        engine.submit([np.zeros((3, 8, 8), np.float32)])


def test_the_cache_honours_detstream_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DETSTREAM_CACHE", str(tmp_path))
    assert openvino_cache_dir() == tmp_path / "openvino"


def test_warm_up_works_with_a_batch_of_one(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OvEngine(spec, "fp32", requests=2, cache_dir=tmp_path / "cache", max_batch=1)
    try:
        engine.warmup()
        assert engine.batch_sizes == (1,)
    finally:
        engine.close()


@pytest.mark.parametrize(("precision", "hint"), [("fp32", "f32"), ("int8", "f32")])
def test_fp32_and_the_float_layers_of_int8_run_in_f32(tmp_path: Path, precision: str, hint: str) -> None:
    engine = OvEngine(make_model(tmp_path / "tiny.onnx", None), precision, cache_dir=tmp_path / "cache")
    try:
        assert engine.inference_precision == hint
    finally:
        engine.close()
