"""create_engine: TensorRT when every step works, else ONNX Runtime with exactly one WARNING naming the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from engine_fakes import FakeTrtRuntime
from engine_models import make_model, random_frames, reference
from host_device import HostDevice

from app.config import EngineConfig
from app.engines import Engine, create_engine, detect_cuda
from app.engines.cuda.host_memory import PinnedAllocator
from app.engines.onnxruntime import OrtEngine
from app.engines.probe import GpuInfo, MachineProbe, Package
from app.engines.tensorrt import TensorRTEngine
from app.errors import EngineError, EngineLoadError

GPU_MACHINE = MachineProbe(gpu=GpuInfo("Fake GPU", "580.0", 1), tensorrt=Package("10.13.3"), tensorrt_flavour="full")
"""A machine with an NVIDIA GPU and full TensorRT, without ONNX Runtime's GPU provider or OpenVINO: the fake
TensorRT runs on it, and its fallback is ONNX Runtime's CPU provider."""


def _create(tmp_path: Path, *, backend: str = "auto", fail_on: dict | None = None, fail_at: str | None = None,
            device_error: Exception | None = None, import_error: bool = False, dynamic_hw: bool = False,
            ) -> tuple[Engine, HostDevice, FakeTrtRuntime]:
    spec = make_model(tmp_path / "tiny.onnx", None, dynamic_hw=dynamic_hw)
    device = HostDevice(fail_on=fail_on)
    runtime = FakeTrtRuntime(device, fail_at=fail_at)

    def device_factory() -> HostDevice:
        if device_error is not None:
            raise device_error
        return device

    def trt_factory() -> FakeTrtRuntime:
        if import_error:
            raise EngineLoadError("tensorrt is not installed: No module named 'tensorrt'")
        return runtime

    config = EngineConfig(backend=backend, max_batch=4, tensorrt={"contexts": 2, "cache_dir": str(tmp_path / "cache")})
    engine = create_engine(spec, config, device_factory=device_factory, trt_factory=trt_factory, probe=GPU_MACHINE)
    return engine, device, runtime


def _fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "app.engines"]


def _computes_the_reference(engine: Engine) -> None:
    frames = random_frames(3)
    for got, want in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_tensorrt_is_used_when_every_step_works(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine, device, _ = _create(tmp_path)
    try:
        assert isinstance(engine, TensorRTEngine) and engine.backend == "tensorrt:fp16"
        assert isinstance(engine.host_allocator(), PinnedAllocator)  # frames are copied to the GPU: page-locked
        _computes_the_reference(engine)
        assert _fallback_lines(caplog) == []
    finally:
        engine.close()
    assert device._streams == []  # the engine owned the device and closed it


def test_a_model_with_dynamic_height_and_width_runs_on_tensorrt_at_its_nominal_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default model declares (N, 3, -1, -1): the engine's profiles pin 8x8 here (416x416 for it)."""
    engine, _, _ = _create(tmp_path, dynamic_hw=True)
    try:
        assert isinstance(engine, TensorRTEngine), _fallback_lines(caplog)
        assert engine.spec.dynamic_hw and not engine.accepts_dynamic_hw  # the pipeline feeds it square frames
        _computes_the_reference(engine)
        assert _fallback_lines(caplog) == []
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("step", "kwargs", "reason"),
    [
        ("import", {"import_error": True}, "tensorrt is not installed"),
        ("device query", {"device_error": EngineLoadError("no usable CUDA driver/GPU")}, "no usable CUDA driver/GPU"),
        ("device name", {"fail_on": {"device_query": 1}}, "injected device_query failure"),
        ("build", {"fail_at": "build"}, "unsupported layer NonMaxSuppression"),
        ("deserialize", {"fail_at": "deserialize"}, "deserialize_cuda_engine returned None"),
        ("context creation", {"fail_at": "context"}, "create_execution_context returned None"),
        ("malloc", {"fail_on": {"malloc": 2}}, "injected malloc failure"),
        ("pinned alloc", {"fail_on": {"host_alloc": 1}}, "injected host_alloc failure"),
        ("stream", {"fail_on": {"stream_create": 2}}, "injected stream_create failure"),
        ("execute", {"fail_on": {"execute": 1}}, "injected execute failure"),
        ("unexpected", {"device_error": MemoryError("cudaMalloc")}, "MemoryError: cudaMalloc"),
    ],
)
def test_a_failure_at_each_tensorrt_step_falls_back_to_onnxruntime_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, step: str, kwargs: dict, reason: str
) -> None:
    engine, device, _ = _create(tmp_path, **kwargs)
    try:
        assert isinstance(engine, OrtEngine), step
        lines = _fallback_lines(caplog)
        assert len(lines) == 1, lines
        assert lines[0].startswith("tensorrt unavailable: ") and reason in lines[0]
        assert lines[0].endswith(f"; using {engine.backend}")
        assert device._streams == [] and device._blocks == {} and device._host_blocks == {}  # nothing leaked
    finally:
        engine.close()  # the fallback's CPU workers stop now, not whenever the engine is collected


def test_a_capture_failure_keeps_tensorrt_with_plain_enqueue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine, _, _ = _create(tmp_path, fail_on={"capture": 1})
    try:
        assert isinstance(engine, TensorRTEngine)
        assert _fallback_lines(caplog) == []
        assert any("graph capture failed" in r.getMessage() for r in caplog.records)
        frames = random_frames(2)
        np.testing.assert_allclose(engine.submit(list(frames)).wait()[0], reference(frames)[0], atol=1e-6)
    finally:
        engine.close()


def test_an_explicit_tensorrt_request_that_cannot_be_met_says_so_and_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, _, _ = _create(tmp_path, backend="tensorrt", import_error=True)
    try:
        assert engine.backend.startswith("onnxruntime:")
        assert _fallback_lines(caplog) == [
            f"tensorrt requested but unavailable: tensorrt is not installed: No module named 'tensorrt'; "
            f"using {engine.backend}"
        ]
    finally:
        engine.close()


def test_onnxruntime_backend_never_touches_tensorrt_or_the_device(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)

    def refuse() -> None:
        raise AssertionError("must not be called")

    engine = create_engine(spec, EngineConfig(backend="onnxruntime"), device_factory=refuse, trt_factory=refuse)
    try:
        assert isinstance(engine, OrtEngine)
        assert engine.host_allocator() is None  # the CPU provider reads frames in place: plain memory
    finally:
        engine.close()


def test_a_second_start_loads_the_cached_engine_instead_of_building(tmp_path: Path) -> None:
    first, _, runtime1 = _create(tmp_path)
    first.close()
    second, _, runtime2 = _create(tmp_path)
    second.close()
    assert (runtime1.builds, runtime2.builds) == (1, 0)


def test_a_corrupt_cached_engine_is_rebuilt_and_never_deserialized(tmp_path: Path) -> None:
    first, _, _ = _create(tmp_path)
    first.close()
    (cached,) = (tmp_path / "cache").glob("*.engine")
    cached.write_bytes(cached.read_bytes()[:-5] + b"XXXXX")
    second, _, runtime = _create(tmp_path)
    second.close()
    assert runtime.builds == 1
    assert all(not blob.endswith(b"XXXXX") for blob in runtime.deserialized)


def test_when_onnxruntime_cannot_load_either_the_error_names_both_reasons(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    Path(spec.path).write_bytes(b"garbage")

    def no_trt() -> None:
        raise EngineLoadError("tensorrt is not installed")

    with pytest.raises(EngineLoadError, match="tensorrt: tensorrt is not installed; onnxruntime cannot load"):
        create_engine(spec, EngineConfig(), trt_factory=no_trt, probe=GPU_MACHINE)


def test_detect_cuda_says_why_cuda_is_not_usable_here() -> None:
    reason = detect_cuda()
    assert reason is None or ("cuda" in reason.lower() or "gpu" in reason.lower())


def test_engine_error_from_the_device_is_an_engine_error_subclass() -> None:
    assert issubclass(EngineLoadError, EngineError)


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_an_onnxruntime_engine_comes_back_warmed_up(tmp_path: Path, backend: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # Without it the first real batch pays for the warm-up: on a GPU provider a cuDNN search of about a second,
    # during which live cameras drop frames.
    warmups = []
    original = OrtEngine.warmup
    monkeypatch.setattr(OrtEngine, "warmup", lambda self: (warmups.append(self), original(self))[1])
    with caplog.at_level(logging.INFO, logger="app.engines"):
        engine, _, _ = _create(tmp_path, backend=backend, import_error=True)
    try:
        assert isinstance(engine, OrtEngine) and warmups == [engine]
        assert any("warmed up in" in r.getMessage() for r in caplog.records)
        _computes_the_reference(engine)
    finally:
        engine.close()


def test_a_model_whose_warm_up_run_fails_is_a_load_error_naming_the_model(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "always-fails.onnx", None, fragile=True, fail_at=0.0)
    with pytest.raises(EngineLoadError, match=r"warm-up run on .*always-fails\.onnx failed"):
        create_engine(spec, EngineConfig(backend="onnxruntime", max_batch=4))
