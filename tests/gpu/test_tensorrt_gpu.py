"""The TensorRT path on a real GPU: build, agreement with ONNX Runtime, graphs, cache reuse.

Every test asserts that the engine really is TensorRT: ``create_engine`` falls back to ONNX Runtime on
any TensorRT failure, and a test that passed on the fallback would say nothing about TensorRT.

Marked ``gpu``; tests/gpu/conftest.py skips them where there is no usable GPU,
and the fixture below where TensorRT is not installed.
The tiny model is built here with onnx.helper, so no download is needed.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engines"))
from engine_models import make_model, random_frames, reference

from app.config import EngineConfig
from app.engines import create_engine
from app.engines.onnxruntime import OrtEngine
from app.engines.tensorrt import TensorRTEngine

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _require_tensorrt() -> None:
    try:
        importlib.import_module("tensorrt")
    except ImportError as error:
        pytest.skip(f"needs TensorRT: tensorrt is not installed: {error}")

FP16_ATOL = 2e-2


def _tensorrt(spec, config: EngineConfig, precision: str) -> TensorRTEngine:
    """``create_engine`` with the check that it did not fall back."""
    engine = create_engine(spec, config)
    if not isinstance(engine, TensorRTEngine):
        engine.close()
        pytest.fail(f"create_engine fell back to {engine.backend} (see the log for TensorRT's error)")
    assert engine.backend == f"tensorrt:{precision}"
    return engine


def _config(tmp_path: Path, precision: str = "fp16", **tensorrt: object) -> EngineConfig:
    return EngineConfig(backend="tensorrt", max_batch=4, precision=precision,
                        tensorrt={"contexts": 2, "cache_dir": str(tmp_path / "cache"), **tensorrt})


def test_a_tensorrt_engine_builds_and_agrees_with_onnxruntime_within_fp16_tolerance(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None, height=64, width=64)
    trt_engine = _tensorrt(spec, _config(tmp_path), "fp16")
    ort_engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=4), ["CPUExecutionProvider"])
    try:
        for n in (1, 3, 4):
            frames = random_frames(n, seed=n, height=64, width=64)
            got = [o.copy() for o in trt_engine.submit(list(frames)).wait()]
            want = ort_engine.submit(list(frames)).wait()
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(a, b, atol=FP16_ATOL)
    finally:
        trt_engine.close()


def test_fp32_engine_matches_numpy_closely(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = _tensorrt(spec, _config(tmp_path, precision="fp32"), "fp32")
    try:
        frames = random_frames(4, seed=3)
        for a, b in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


def test_cuda_graph_replay_equals_plain_enqueue_on_the_gpu(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    frames = [random_frames(n, seed=20 + n) for n in (1, 2, 3, 4, 2)]
    results = {}
    for graphs in (False, True):
        engine = _tensorrt(spec, _config(tmp_path, cuda_graphs=graphs, precision="fp32"), "fp32")
        try:
            results[graphs] = [[o.copy() for o in engine.submit(list(f)).wait()] for f in frames]
            if graphs:
                assert any(slot.graphs for slot in engine._scheduler.slots), "no graph was captured"
        finally:
            engine.close()
    for plain, replay in zip(results[False], results[True], strict=True):
        for a, b in zip(plain, replay, strict=True):
            np.testing.assert_array_equal(a, b)


def test_static_batch_one_model_runs_batches_in_steps(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "static.onnx", 1)
    engine = _tensorrt(spec, _config(tmp_path, precision="fp32"), "fp32")
    try:
        assert engine.batch_sizes == (1,)
        frames = random_frames(3, seed=5)
        np.testing.assert_allclose(engine.submit(list(frames)).wait()[0], reference(frames)[0], rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_static_batch_two_steps_run_at_aligned_addresses(tmp_path: Path, n: int) -> None:
    spec = make_model(tmp_path / "static2.onnx", 2)  # a 12-byte output row: unaligned steps would be refused
    engine = _tensorrt(spec, _config(tmp_path, precision="fp32"), "fp32")
    try:
        frames = random_frames(n, seed=n)
        for a, b in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


def test_two_contexts_of_a_fixed_batch_open_size_engine_run_on_their_own_profiles(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "open.onnx", 1, dynamic_hw=True)
    engine = _tensorrt(spec, EngineConfig(backend="tensorrt", max_batch=1, precision="fp32",
                                          tensorrt={"contexts": 2, "cache_dir": str(tmp_path / "cache")}), "fp32")
    try:
        for seed in range(4):
            frames = random_frames(1, seed=seed)
            np.testing.assert_allclose(engine.submit(list(frames)).wait()[0], reference(frames)[0],
                                       rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


def test_a_second_start_uses_the_cached_engine(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    _tensorrt(spec, _config(tmp_path), "fp16").close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="app.engines.tensorrt.cache"):
        _tensorrt(spec, _config(tmp_path), "fp16").close()
    assert any("using cached TensorRT engine" in r.getMessage() for r in caplog.records)


def test_build_engine_main_writes_an_engine_that_create_engine_picks_up(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    from app.engines.tensorrt.prebuild import build_engine_main

    spec = make_model(tmp_path / "tiny.onnx", None)
    path = build_engine_main(Path(spec.path), fp16=True, int8=False, calib=None, batch=(1, 4, 4),
                             cache_dir=tmp_path / "cache", progress=True, contexts=2)
    assert path.exists()
    with caplog.at_level(logging.INFO, logger="app.engines.tensorrt.cache"):
        _tensorrt(spec, _config(tmp_path), "fp16").close()
    assert any("using cached TensorRT engine" in r.getMessage() for r in caplog.records)

