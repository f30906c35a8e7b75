"""OvEngine on the tiny model: the same outputs as numpy, rectangular inputs, workers, cache and close.

OvEngine reads uint8 ``(H, W, 3)`` pixels and scales them in its graph; :func:`pixels` makes those from the
helpers' float frames, and the reference runs on what the model then sees (``pixels / 255``)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from engine_models import make_model, random_frames, reference

from app.engines.openvino import OvEngine, openvino_cache_dir
from app.errors import EngineError
from app.types import UINT8_HWC


def pixels(frames: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """``(N, 3, H, W)`` floats in [0, 1) as the engine's ``(H, W, 3)`` uint8 frames, and the float input the
    model sees for them."""
    quantized = np.round(np.asarray(frames) * 255).astype(np.uint8)
    return [np.ascontiguousarray(f.transpose(1, 2, 0)) for f in quantized], quantized.astype(np.float32) / 255


@pytest.fixture
def engine(tmp_path: Path) -> OvEngine:
    spec = make_model(tmp_path / "tiny.onnx", None, dynamic_hw=True)
    ov = OvEngine(spec, "fp32", requests=2, cache_dir=tmp_path / "cache")
    yield ov
    ov.close()


def test_outputs_match_the_reference_in_fp32(engine: OvEngine) -> None:
    assert engine.backend == "openvino:CPU:fp32" and engine.batch_window is False
    assert engine.frame_format is UINT8_HWC
    frames, seen = pixels(random_frames(2))
    for got, want in zip(engine.submit(frames).wait(), reference(seen), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_float_frames_are_refused_with_what_it_takes(engine: OvEngine) -> None:
    with pytest.raises(ValueError, match=r"\(height, width, 3\) uint8"):
        engine.submit(list(random_frames(1)))


def test_a_rectangular_size_compiles_once_and_computes_right(engine: OvEngine) -> None:
    assert engine.accepts_dynamic_hw
    frames, seen = pixels(random_frames(2, height=4, width=8))
    for _ in range(2):
        got = engine.submit(frames).wait()
        np.testing.assert_allclose(got[1], reference(seen)[1], rtol=1e-5)
    with pytest.raises(ValueError, match="multiples of 4"):
        engine.submit([np.zeros((6, 8, 3), np.uint8)])


def test_the_warm_up_size_is_released_when_frames_use_another(engine: OvEngine) -> None:
    nominal = (engine.spec.input_height, engine.spec.input_width)
    engine.warmup()
    assert engine.compiled_sizes == (nominal,)
    rect, rect_seen = pixels(random_frames(2, height=4, width=8))
    engine.submit(rect).wait()
    assert engine.compiled_sizes == ((4, 8),)
    square, seen = pixels(random_frames(2))  # the nominal size is compiled again when a frame needs it, then kept
    for got, want in zip(engine.submit(square).wait(), reference(seen), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(engine.submit(rect).wait()[1], reference(rect_seen)[1], rtol=1e-5)
    assert set(engine.compiled_sizes) == {nominal, (4, 8)}


def test_a_size_used_by_frames_stays_compiled(engine: OvEngine) -> None:
    engine.submit(pixels(random_frames(1))[0]).wait()
    engine.submit(pixels(random_frames(1, height=4, width=8))[0]).wait()
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
        engine.submit([np.zeros((8, 8, 3), np.uint8)])


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


def test_fp32_runs_in_f32_and_int8_takes_the_plugin_default_for_its_float_layers(tmp_path: Path) -> None:
    import openvino as ov

    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()  # bf16 on a bf16 CPU
    for precision, hint in (("fp32", "f32"), ("int8", default)):
        engine = OvEngine(make_model(tmp_path / "tiny.onnx", None), precision, cache_dir=tmp_path / "cache")
        try:
            assert engine.inference_precision == hint
        finally:
            engine.close()
