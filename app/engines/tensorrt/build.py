"""Building TensorRT engines from ONNX: parser, profiles, fp16/int8, timing cache, progress.

Used two ways: by :meth:`~app.engines.tensorrt.adapter.RealTrtRuntime.build` when
``create_engine`` finds no cached engine, and by the ``build-engine`` command
(:mod:`app.engines.tensorrt.prebuild`) to build ahead of time. Both write the same
cache file (see :mod:`app.engines.tensorrt.cache`), so a pre-built engine is picked
up when its key matches (batch ``1:max:max``, the configured contexts and precision).

INT8 uses TensorRT's entropy calibrator (implicit quantization), which exists
in TensorRT 10 (deprecated there) and is gone in 11; there an INT8 build is
refused with a message pointing at explicitly quantized (Q/DQ) ONNX models.
Runs on the calling thread; a build takes minutes and is logged by phase.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from app.engines.cuda.device import CudaDevice, Device
from app.engines.cuda.host_memory import alloc_host
from app.engines.tensorrt.runtime import BuildOptions
from app.errors import EngineError, EngineLoadError

logger = logging.getLogger(__name__)

CALIB_BATCH = 8


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
