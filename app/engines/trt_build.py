"""Building TensorRT engines from ONNX: parser, profiles, fp16/int8, timing cache, progress.

Used two ways: by :class:`~app.engines.trt_runtime.RealTrtRuntime.build` when
``create_engine`` finds no cached engine, and by the ``build-engine`` command
(:func:`build_engine_main`) to build ahead of time. Both write the same cache
file (see :mod:`app.engines.cache`), so a pre-built engine is picked up when
its key matches (batch ``1:max:max``, the configured contexts and precision).

INT8 uses TensorRT's entropy calibrator (implicit quantization), which exists
in TensorRT 10 (deprecated there) and is gone in 11; there an INT8 build is
refused with a message pointing at explicitly quantized (Q/DQ) ONNX models.
Runs on the calling thread; a build takes minutes and is logged by phase.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from app.engines.cache import EngineCacheKey, cache_path, write_cached
from app.engines.calibration import iter_calibration_frames
from app.engines.device import CudaDevice, Device
from app.engines.host_memory import alloc_host
from app.engines.scheduler import plan_profiles
from app.engines.trt_runtime import BuildOptions, RealTrtRuntime, import_tensorrt
from app.errors import EngineError, EngineLoadError, ModelError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

CALIB_BATCH = 8
CALIB_MAX_FRAMES = 512


def build_serialized(trt: ModuleType, trt_logger: Any, onnx_path: Path, options: BuildOptions) -> bytes:
    """Parse ``onnx_path`` and build a serialized engine as ``options`` say. Raises :class:`EngineError`."""
    logger.info("tensorrt build: parsing %s", onnx_path)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"tensorrt cannot parse {onnx_path}: {errors or 'unknown parser error'}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    _add_profiles(builder, network, config, options)
    _set_precision(trt, config, options)
    timing = _attach_timing_cache(config, options.timing_cache)
    calibrator = _attach_calibrator(trt, builder, config, options) if options.precision == "int8" else None
    if options.progress:
        _attach_progress(trt, config)
    logger.info("tensorrt build: optimising (%s, profiles %s × %d contexts)",
                options.precision, options.profiles, options.contexts)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError(f"tensorrt build of {onnx_path} failed (see the TensorRT errors logged above)")
    if timing is not None and options.timing_cache is not None:
        options.timing_cache.parent.mkdir(parents=True, exist_ok=True)
        options.timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    del calibrator
    logger.info("tensorrt build: done (%d bytes)", serialized.nbytes)
    return bytes(serialized)


def _add_profiles(builder: Any, network: Any, config: Any, options: BuildOptions) -> None:
    """One profile set per context (see :class:`BuildOptions`); a static-batch input needs none."""
    shape = tuple(network.get_input(0).shape)
    if all(d > 0 for d in shape):
        return
    h, w = options.input_hw
    for _ in range(options.contexts):
        for low, opt, high in options.profiles:
            profile = builder.create_optimization_profile()
            profile.set_shape(options.input_name, (low, 3, h, w), (opt, 3, h, w), (high, 3, h, w))
            config.add_optimization_profile(profile)


def _set_precision(trt: ModuleType, config: Any, options: BuildOptions) -> None:
    wanted = {"fp32": [], "fp16": ["FP16"], "int8": ["FP16", "INT8"]}[options.precision]
    for name in wanted:
        flag = getattr(trt.BuilderFlag, name, None)
        if flag is None:
            raise EngineLoadError(f"this TensorRT ({trt.__version__}) has no {name} builder flag; "
                                  "export a model in that precision instead")
        config.set_flag(flag)


def _attach_timing_cache(config: Any, path: Path | None) -> Any:
    """Kernel timings survive between builds (a rebuild after a driver update takes seconds, not minutes)."""
    if path is None:
        return None
    data = path.read_bytes() if path.exists() else b""
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        logger.info("tensorrt build: timing cache %s is for another GPU or TensorRT; starting a new one", path)
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def _attach_calibrator(trt: ModuleType, builder: Any, config: Any, options: BuildOptions) -> Any:
    base = getattr(trt, "IInt8EntropyCalibrator2", None)
    if base is None:
        raise EngineLoadError(f"int8 calibration needs TensorRT 10 (this is {trt.__version__}, where implicit "
                              "quantization is gone): use an explicitly quantized (Q/DQ) ONNX model")
    if options.calib_frames is None:
        raise EngineLoadError("int8 needs calibration frames: set engine.calib to a video file or image folder")
    h, w = options.input_hw
    calibrator = make_calibrator(base, CudaDevice.open(), options.calib_frames(), (3, h, w), options.calib_cache)
    config.int8_calibrator = calibrator
    profile = builder.create_optimization_profile()
    shape = (CALIB_BATCH, 3, h, w)
    profile.set_shape(options.input_name, shape, shape, shape)
    config.set_calibration_profile(profile)
    return calibrator


def make_calibrator(
    base: type, device: Device, frames: Iterator[np.ndarray], frame_shape: tuple[int, ...], cache: Path | None
) -> Any:
    """An entropy calibrator (``base`` is ``trt.IInt8EntropyCalibrator2``) fed ``CALIB_BATCH`` frames at a time."""

    class EntropyCalibrator(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self._host = alloc_host((CALIB_BATCH, *frame_shape), np.float32, device=device)
            self._device_ptr = device.malloc(self._host.nbytes)
            self._stream = device.stream_create()
            self._event = device.event_create()
            self._batches = 0

        def get_batch_size(self) -> int:
            return CALIB_BATCH

        def get_batch(self, names: list[str]) -> list[int] | None:
            filled = 0
            for frame in frames:
                self._host.array[filled] = frame
                filled += 1
                if filled == CALIB_BATCH:
                    break
            if filled < CALIB_BATCH:
                logger.info("int8 calibration: %d batches used", self._batches)
                return None
            device.memcpy_htod_async(self._device_ptr, self._host.ptr, self._host.nbytes, self._stream)
            device.event_record(self._event, self._stream)
            device.event_synchronize(self._event)
            self._batches += 1
            return [self._device_ptr]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache is not None and cache.exists() else None

        def write_calibration_cache(self, data: Any) -> None:
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_bytes(bytes(data))

    return EntropyCalibrator()


def _attach_progress(trt: ModuleType, config: Any) -> None:
    """Log build phases through ``IProgressMonitor`` when this TensorRT has it (top-level at INFO)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        logger.info("tensorrt build: no progress monitor in this TensorRT; phases are logged only")
        return

    class PhaseLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            level = logging.INFO if parent_phase is None else logging.DEBUG
            logger.log(level, "tensorrt build: %s (%d steps)", phase_name, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            logger.debug("tensorrt build: %s step %d", phase_name, step)
            return True

        def phase_finish(self, phase_name: str) -> None:
            logger.debug("tensorrt build: %s done", phase_name)

    config.progress_monitor = PhaseLogger()


def calibration_source(options: BuildOptions, spec: ModelSpec, calib: Path | None, cache_dir: Path) -> BuildOptions:
    """``options`` with calibration frames from ``calib`` (a video or image folder) and a calibration cache."""
    frames = None
    if calib is not None:
        def frames() -> Iterator[np.ndarray]:
            return iter_calibration_frames(calib, spec.input_height, spec.input_width, spec.scale, CALIB_MAX_FRAMES)
    cache = cache_dir / f"{Path(spec.path).stem}.calib"
    return dataclasses.replace(options, calib_frames=frames, calib_cache=cache)


def build_engine_main(
    onnx_path: Path,
    *,
    fp16: bool,
    int8: bool,
    calib: Path | None,
    batch: tuple[int, int, int],
    cache_dir: Path,
    progress: bool,
    contexts: int = 2,
) -> Path:
    """The ``build-engine`` command: build the engine for ``onnx_path`` into ``cache_dir``; returns its file."""
    onnx_path, cache_dir = Path(onnx_path), Path(cache_dir).expanduser()
    try:
        device = CudaDevice.open()
        runtime = RealTrtRuntime(import_tensorrt())
    except EngineLoadError as error:
        raise EngineLoadError(f"build-engine needs an NVIDIA GPU with TensorRT ≥ 10: {error}") from None
    spec = _spec_from_onnx(onnx_path)
    precision = "int8" if int8 else "fp16" if fp16 else "fp32"
    profiles = plan_profiles(*batch)
    from app.engines.tensorrt import file_sha256

    key = EngineCacheKey(file_sha256(onnx_path), runtime.version, device.device_name(), device.compute_capability(),
                         precision, profiles, contexts)
    options = BuildOptions(spec.input_name, (spec.input_height, spec.input_width), precision, profiles, contexts,
                           timing_cache=cache_dir / "timing.cache", progress=progress)
    if int8:
        options = calibration_source(options, spec, calib, cache_dir)
    path = cache_path(cache_dir, onnx_path.stem, key)
    write_cached(path, key, runtime.build(onnx_path, options))
    logger.info("engine written to %s", path)
    return path


def _spec_from_onnx(onnx_path: Path) -> ModelSpec:
    """Input name and size straight from the ONNX file (the builder needs nothing else)."""
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as error:
        raise ModelError(f"{onnx_path}: not a readable ONNX model ({error})") from None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if not inputs:
        raise ModelError(f"{onnx_path}: the model has no input")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[2] <= 0 or dims[3] <= 0:
        raise ModelError(f"{onnx_path}: input {inputs[0].name} is {dims}; need N×3×H×W with fixed H and W")
    return ModelSpec(name=onnx_path.stem, path=str(onnx_path), input_name=inputs[0].name, input_height=dims[2],
                     input_width=dims[3], layout="yolov8", class_names=(),
                     static_batch=dims[0] if dims[0] > 0 else None)
