"""The adapters to the tensorrt module and the builder, on a fake module shaped like TensorRT 10 and 11."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from fake_trt_module import NetworkDefinitionCreationFlag, Severity, make_module

from app.engines.tensorrt.adapter import RealTrtRuntime, import_tensorrt, make_trt_logger
from app.engines.tensorrt.build import build_serialized
from app.engines.tensorrt.runtime import BuildOptions
from app.errors import EngineError, EngineLoadError

runtime_api = pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is a dev dependency")

STRONGLY_TYPED = 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def _stream() -> object:
    """A stream handle as cuda-bindings returns it (its native handle is 0xABC)."""
    return runtime_api.cudaStream_t(0xABC)


def _options(tmp_path: Path, **changes: object) -> BuildOptions:
    settings = {"input_name": "images", "input_hw": (8, 8), "precision": "fp16", "profiles": ((1, 4, 4),),
                "contexts": 2, "timing_cache": tmp_path / "timing.cache", **changes}
    return BuildOptions(**settings)


def test_a_deserialized_engine_is_described_by_tensor_names_modes_shapes_and_profiles() -> None:
    model = RealTrtRuntime(make_module()).deserialize(b"plan")
    assert [(t.name, t.is_input, t.shape, t.dtype) for t in model.tensors] == [
        ("images", True, (-1, 3, 8, 8), np.dtype(np.float32)),
        ("pooled", False, (-1, 3), np.dtype(np.float32)),
    ]
    assert model.num_profiles == 2
    assert model.profile_batch_range("images", 1) == (1, 4, 4)


def test_a_plan_tensorrt_refuses_to_deserialize_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="deserialize_cuda_engine returned None"):
        RealTrtRuntime(make_module()).deserialize(b"foreign plan")


def test_context_calls_pass_the_native_stream_handle_and_refusals_raise() -> None:
    trt = make_module()
    context = RealTrtRuntime(trt).deserialize(b"plan").create_context()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # int(stream) is deprecated in cuda-bindings
        context.set_optimization_profile(1, _stream())
        context.set_input_shape("images", (2, 3, 8, 8))
        context.set_tensor_address("images", 4096)
        context.execute(_stream())
    assert trt.calls == [("profile", 1, 0xABC), ("shape", "images", (2, 3, 8, 8)), ("address", "images", 4096),
                         ("execute", 0xABC)]
    context._context.ok = False
    with pytest.raises(EngineError, match="execute_async_v3 failed"):
        context.execute(_stream())
    with pytest.raises(EngineError, match=r"set_input_shape\(images"):
        context.set_input_shape("images", (9, 3, 8, 8))


def test_a_refused_optimization_profile_is_an_engine_error_not_a_runtime_error() -> None:
    context = RealTrtRuntime(make_module()).deserialize(b"plan").create_context()
    context._context.ok = False  # the real bindings raise RuntimeError (they never return False)
    with pytest.raises(EngineError, match=r"set_optimization_profile_async\(1\) failed"):
        context.set_optimization_profile(1, _stream())


def test_release_drops_the_context_and_the_engine() -> None:
    model = RealTrtRuntime(make_module()).deserialize(b"plan")
    context = model.create_context()
    context.release()
    model.release()
    assert context._context is None and model._engine is None
    context.release()
    model.release()


@pytest.mark.parametrize(
    ("severity", "level"),
    [(Severity.INTERNAL_ERROR, logging.CRITICAL), (Severity.ERROR, logging.ERROR), (Severity.WARNING, logging.WARNING),
     (Severity.INFO, logging.DEBUG), (Severity.VERBOSE, logging.DEBUG)],
)
def test_tensorrt_severities_map_to_logging_levels(caplog: pytest.LogCaptureFixture, severity: Severity,
                                                   level: int) -> None:
    caplog.set_level(logging.DEBUG, logger="app.engines.tensorrt.adapter")
    make_trt_logger(make_module()).log(severity, "message from tensorrt")
    (record,) = caplog.records
    assert record.levelno == level and record.getMessage() == "tensorrt: message from tensorrt"


@pytest.mark.parametrize(("version", "ok"), [("10.13.3.9", True), ("10.16.1.11", True), ("11.4.0.106", True),
                                             ("10.8.0", False), ("8.6.1", False), ("12.0.0", False)])
def test_supported_tensorrt_versions_and_a_one_line_install_hint_otherwise(
        monkeypatch: pytest.MonkeyPatch, version: str, ok: bool) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", make_module(version=version))
    if ok:
        assert import_tensorrt().__version__ == version
    else:
        with pytest.raises(EngineLoadError, match=r"not supported .*tensorrt>=10\.13,<12.*pip install") as error:
            import_tensorrt()
        assert "\n" not in str(error.value)


def test_a_missing_tensorrt_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EngineLoadError, match=r"not installed .*pip install 'detstream\[tensorrt\]'"):
        import_tensorrt()


@pytest.mark.parametrize("version", ["10.13.3", "11.4.0"])
def test_the_builder_makes_a_strongly_typed_network_with_a_profile_set_per_context(tmp_path: Path,
                                                                                   version: str) -> None:
    trt = make_module(version=version)
    options = _options(tmp_path, profiles=((1, 4, 4), (5, 8, 16)), progress=True)
    assert build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", options) == b"plan"
    (config,) = [c[1] for c in trt.calls if c[0] == "build"]
    shapes = [p.shapes["images"] for p in config.profiles]
    one_set = [((1, 3, 8, 8), (4, 3, 8, 8), (4, 3, 8, 8)), ((5, 3, 8, 8), (8, 3, 8, 8), (16, 3, 8, 8))]
    assert shapes == one_set * 2
    assert config.flags == []  # precision comes from the model's types: no FP16/INT8 builder flags
    assert isinstance(config.progress_monitor, trt.IProgressMonitor)
    assert ("create_network", STRONGLY_TYPED) in trt.calls
    assert (tmp_path / "timing.cache").read_bytes() == b"timing:"


def test_a_static_batch_network_needs_no_profiles(tmp_path: Path) -> None:
    trt = make_module(input_shape=(1, 3, 8, 8))
    build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, precision="fp32"))
    (config,) = [c[1] for c in trt.calls if c[0] == "build"]
    assert config.profiles == [] and config.flags == []


def test_a_fixed_batch_with_open_height_and_width_gets_that_batch_in_every_profile(tmp_path: Path) -> None:
    trt = make_module(input_shape=(2, 3, -1, -1))
    build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, profiles=((1, 4, 4),)))
    (config,) = [c[1] for c in trt.calls if c[0] == "build"]
    assert [p.shapes["images"] for p in config.profiles] == [((2, 3, 8, 8),) * 3] * 2  # one per context


def test_a_profile_tensorrt_refuses_is_an_engine_error(tmp_path: Path) -> None:
    trt = make_module(input_shape=(-1, 3, 8, 8))
    with pytest.raises(EngineError, match="refused the optimization profile 4:2:8"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, profiles=((4, 2, 8),)))


@pytest.mark.parametrize("kind", ["foreign", "corrupt"])
def test_a_foreign_or_corrupt_timing_cache_is_replaced_with_a_warning(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "timing.cache").write_bytes(b"from an A100")
    trt = make_module(timing_cache=kind)
    assert build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path)) == b"plan"
    assert (tmp_path / "timing.cache").read_bytes() == b"timing:"
    assert any(r.levelno == logging.WARNING and "timing cache" in r.getMessage() for r in caplog.records)


def test_the_timing_cache_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engines.tensorrt import build

    written: list[Path] = []
    real = build.atomic_write_bytes
    monkeypatch.setattr(build, "atomic_write_bytes", lambda path, data: written.append(path) or real(path, data))
    trt = make_module()
    build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))
    assert written == [tmp_path / "timing.cache"]
    assert [p.name for p in tmp_path.iterdir()] == ["timing.cache"]


def test_a_parser_failure_names_the_file_and_every_parser_error(tmp_path: Path) -> None:
    trt = make_module(parse_ok=False)
    with pytest.raises(EngineError, match=r"cannot parse .*m\.onnx: In node 0 .*; In node 1 .*UNSUPPORTED_NODE"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))


def test_a_build_that_returns_nothing_is_an_engine_error(tmp_path: Path) -> None:
    trt = make_module(build_ok=False)
    with pytest.raises(EngineError, match=r"build of .*m\.onnx failed"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))


def test_build_engine_refuses_clearly_without_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from app.engines.cuda.device import CudaDevice
    from app.engines.tensorrt import prebuild

    def no_gpu() -> CudaDevice:
        raise EngineLoadError("no usable CUDA driver/GPU: cudaGetDeviceCount returned cudaErrorNoDevice")

    monkeypatch.setattr(prebuild.CudaDevice, "open", staticmethod(no_gpu))
    with pytest.raises(EngineLoadError, match=r"^build-engine needs an NVIDIA GPU with TensorRT ≥ 10: no usable CUDA"):
        prebuild.build_engine_main(tmp_path / "m.onnx", fp16=True, int8=False, calib=None, batch=(1, 8, 8),
                                    cache_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("version", ["11.4.0", "10.13.3"])
def test_the_default_config_builds_from_the_fp16_model_on_tensorrt_11_and_10_without_falling_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    from engine_models import make_model
    from host_device import HostDevice

    from app.config import EngineConfig
    from app.engines.tensorrt import TensorRTEngine, adapter, open_tensorrt_engine

    trt = make_module(version=version)
    engine_class = type(trt.Runtime(None).deserialize_cuda_engine(b"plan"))  # the fake engine: the tiny model's tensors
    monkeypatch.setattr(engine_class, "names", ("images", "pooled", "scaled"))
    monkeypatch.setattr(engine_class, "shapes", {"images": (-1, 3, 8, 8), "pooled": (-1, 3), "scaled": (-1, 3, 8, 8)})
    monkeypatch.setattr(engine_class, "num_io_tensors", 3)
    monkeypatch.setattr(engine_class, "num_optimization_profiles", 2)
    monkeypatch.setattr(adapter, "native_handle", id)  # HostDevice streams are not cuda-bindings objects
    spec = make_model(tmp_path / "tiny.onnx", None)
    device = HostDevice()
    config = EngineConfig(max_batch=4, tensorrt={"contexts": 2})  # the default precision
    try:  # the whole "try TensorRT" path create_engine takes; any failure would raise (and fall back)
        engine = open_tensorrt_engine(spec, config, device, RealTrtRuntime(trt), tmp_path / "cache")
        try:
            assert isinstance(engine, TensorRTEngine) and engine.backend == "tensorrt:fp16"
        finally:
            engine.close()
    finally:
        device.close()
    (parsed,) = [name for kind, name, *_ in trt.calls if kind == "parse"]
    assert parsed.startswith("tiny-fp16-")
    assert ("create_network", STRONGLY_TYPED) in trt.calls
