"""The adapters to the tensorrt module, the builder and the INT8 calibrator, on a fake module and HostDevice."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_trt_module import Severity, make_module
from host_device import HostDevice

from app.engines.tensorrt.adapter import RealTrtRuntime, import_tensorrt, make_trt_logger
from app.engines.tensorrt.build import CALIB_BATCH, build_serialized, make_calibrator
from app.engines.tensorrt.calibration import iter_calibration_frames, letterbox_chw
from app.engines.tensorrt.runtime import BuildOptions
from app.errors import EngineError, EngineLoadError, ModelError


class _Stream:
    """A stream handle like cuda-python's: converts to the pointer value with int()."""

    def __int__(self) -> int:
        return 0xABC


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


def test_context_calls_pass_the_stream_as_an_integer_and_refusals_raise() -> None:
    trt = make_module()
    context = RealTrtRuntime(trt).deserialize(b"plan").create_context()
    context.set_optimization_profile(1, _Stream())
    context.set_input_shape("images", (2, 3, 8, 8))
    context.set_tensor_address("images", 4096)
    context.execute(_Stream())
    assert trt.calls == [("profile", 1, 0xABC), ("shape", "images", (2, 3, 8, 8)), ("address", "images", 4096),
                         ("execute", 0xABC)]
    context._context.ok = False
    with pytest.raises(EngineError, match="execute_async_v3 failed"):
        context.execute(_Stream())
    with pytest.raises(EngineError, match=r"set_input_shape\(images"):
        context.set_input_shape("images", (9, 3, 8, 8))


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


@pytest.mark.parametrize(("version", "ok"), [("10.0.1", True), ("11.4.0.106", True), ("8.6.1", False)])
def test_only_tensorrt_10_or_newer_is_accepted(monkeypatch: pytest.MonkeyPatch, version: str, ok: bool) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", make_module(version=version))
    if ok:
        assert import_tensorrt().__version__ == version
    else:
        with pytest.raises(EngineLoadError, match="too old"):
            import_tensorrt()


def test_the_builder_adds_one_profile_set_per_context_sets_fp16_and_saves_the_timing_cache(tmp_path: Path) -> None:
    trt = make_module()
    options = _options(tmp_path, profiles=((1, 4, 4), (5, 8, 16)), progress=True)
    assert build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", options) == b"plan"
    (config,) = [c[1] for c in trt.calls if c[0] == "build"]
    shapes = [p.shapes["images"] for p in config.profiles]
    one_set = [((1, 3, 8, 8), (4, 3, 8, 8), (4, 3, 8, 8)), ((5, 3, 8, 8), (8, 3, 8, 8), (16, 3, 8, 8))]
    assert shapes == one_set * 2
    assert config.flags == ["fp16"]
    assert isinstance(config.progress_monitor, trt.IProgressMonitor)
    assert ("create_network", 0) in trt.calls
    assert (tmp_path / "timing.cache").read_bytes() == b"timing:"


def test_a_static_batch_network_needs_no_profiles_and_fp32_sets_no_flag(tmp_path: Path) -> None:
    trt = make_module(input_shape=(1, 3, 8, 8))
    build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, precision="fp32"))
    (config,) = [c[1] for c in trt.calls if c[0] == "build"]
    assert config.profiles == [] and config.flags == []


def test_a_timing_cache_from_another_gpu_is_replaced_not_used(tmp_path: Path) -> None:
    (tmp_path / "timing.cache").write_bytes(b"from an A100")
    trt = make_module(timing_cache_matches=False)
    build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))
    assert (tmp_path / "timing.cache").read_bytes() == b"timing:"


def test_a_parser_failure_names_the_file_and_every_parser_error(tmp_path: Path) -> None:
    trt = make_module(parse_ok=False)
    with pytest.raises(EngineError, match=r"cannot parse .*m\.onnx: In node 0 .*; In node 1 .*UNSUPPORTED_NODE"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))


def test_a_build_that_returns_nothing_is_an_engine_error(tmp_path: Path) -> None:
    trt = make_module(build_ok=False)
    with pytest.raises(EngineError, match=r"build of .*m\.onnx failed"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path))


def test_int8_on_a_tensorrt_without_the_calibrator_points_at_explicit_quantization(tmp_path: Path) -> None:
    trt = make_module(version="11.4.0", with_int8=False)
    with pytest.raises(EngineLoadError, match="Q/DQ"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, precision="int8"))


def test_int8_without_calibration_frames_says_to_set_engine_calib(tmp_path: Path) -> None:
    trt = make_module()
    with pytest.raises(EngineLoadError, match=r"engine\.calib"):
        build_serialized(trt, make_trt_logger(trt), tmp_path / "m.onnx", _options(tmp_path, precision="int8"))


def test_the_calibrator_feeds_full_batches_to_device_memory_then_stops_and_keeps_its_cache(tmp_path: Path) -> None:
    trt = make_module()
    device = HostDevice()
    frames = [np.full((3, 8, 8), i, np.float32) for i in range(CALIB_BATCH * 2 + 3)]
    cache = tmp_path / "model.calib"
    try:
        calibrator = make_calibrator(trt.IInt8EntropyCalibrator2, device, iter(frames), (3, 8, 8), cache)
        assert calibrator.get_batch_size() == CALIB_BATCH
        assert calibrator.read_calibration_cache() is None
        for batch in range(2):
            (ptr,) = calibrator.get_batch(["images"])
            got = device.view(ptr, CALIB_BATCH * 3 * 8 * 8 * 4).view(np.float32).reshape(CALIB_BATCH, 3, 8, 8)
            np.testing.assert_array_equal(got[:, 0, 0, 0], np.arange(CALIB_BATCH) + batch * CALIB_BATCH)
        assert calibrator.get_batch(["images"]) is None  # 3 left over: not a full batch
        calibrator.write_calibration_cache(memoryview(b"scales"))
        assert calibrator.read_calibration_cache() == b"scales"
    finally:
        device.close()


def test_calibration_frames_from_an_image_folder_are_letterboxed_model_inputs(tmp_path: Path) -> None:
    import cv2

    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((20, 40, 3), (255, 0, 0), np.uint8))  # blue, 2:1
    frames = list(iter_calibration_frames(tmp_path, 16, 16, 1 / 255, limit=2))
    assert len(frames) == 2 and frames[0].shape == (3, 16, 16) and frames[0].dtype == np.float32
    np.testing.assert_allclose(frames[0][:, 8, 8], [0, 0, 1])  # RGB order: blue lands in channel 2
    np.testing.assert_allclose(frames[0][:, 0, 8], [114 / 255] * 3, rtol=1e-6)  # padding rows above


def test_calibration_frames_are_spread_over_a_video(tmp_path: Path) -> None:
    import cv2

    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (32, 32))
    for i in range(20):
        writer.write(np.full((32, 32, 3), i * 10, np.uint8))
    writer.release()
    frames = list(iter_calibration_frames(path, 32, 32, 1.0, limit=5))
    assert len(frames) == 5
    levels = [float(f.mean()) for f in frames]
    assert levels == sorted(levels) and levels[-1] - levels[0] > 100  # every 4th frame, not the first five


def test_a_missing_calibration_source_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        iter_calibration_frames(tmp_path / "nope.mp4", 8, 8, 1.0, 4)
    with pytest.raises(ModelError, match="no images"):
        iter_calibration_frames(tmp_path, 8, 8, 1.0, 4)


def test_letterbox_keeps_the_aspect_ratio_and_centres_the_image() -> None:
    out = letterbox_chw(np.zeros((10, 20, 3), np.uint8), 20, 20, 1.0)
    assert out.shape == (3, 20, 20)
    assert (out[:, :5] == 114).all() and (out[:, 15:] == 114).all() and (out[:, 5:15] == 0).all()


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
