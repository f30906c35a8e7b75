"""Building TensorRT engines from ONNX: a strongly typed network, profiles per context, timing cache, progress.

Used two ways: by :meth:`~app.engines.tensorrt.adapter.RealTrtRuntime.build` when
``create_engine`` finds no cached engine, and by the ``build-engine`` command
(:mod:`app.engines.tensorrt.prebuild`) to build ahead of time. Both write the same
cache file (see :mod:`app.engines.tensorrt.cache`).

Precision comes from the model, on TensorRT 10 and 11 alike: the network is strongly
typed (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``), so TensorRT runs each layer in
the type the ONNX file declares. fp16 is an fp16 copy of the model
(:mod:`app.models.quantization.fp16`), int8 the explicitly quantized (Q/DQ) model that
``detstream quantize`` calibrates with the pipeline's own letterbox. No builder precision
flags and no implicit calibrator: TensorRT 11 has neither.
Runs on the calling thread; a build takes minutes and is logged by phase.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from app.engines.tensorrt.runtime import BuildOptions
from app.errors import EngineError
from app.models.store.files import atomic_write_bytes

logger = logging.getLogger(__name__)


def build_serialized(trt: ModuleType, trt_logger: Any, onnx_path: Path, options: BuildOptions) -> bytes:
    """Parse ``onnx_path`` and build a serialized engine as ``options`` say. Raises :class:`EngineError`."""
    logger.info("tensorrt build: parsing %s", onnx_path)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"tensorrt cannot parse {onnx_path}: {errors or 'unknown parser error'}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    add_profiles(builder, network, config, options)
    timing = _attach_timing_cache(config, options.timing_cache)
    if options.progress:
        _attach_progress(trt, config)
    logger.info("tensorrt build: optimising (%s model, profiles %s × %d contexts)",
                options.precision, options.profiles, options.contexts)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError(f"tensorrt build of {onnx_path} failed (see the TensorRT errors logged above)")
    if timing is not None and options.timing_cache is not None:
        atomic_write_bytes(options.timing_cache, bytes(config.get_timing_cache().serialize()))
    logger.info("tensorrt build: done (%d bytes)", serialized.nbytes)
    return bytes(serialized)


def add_profiles(builder: Any, network: Any, config: Any, options: BuildOptions) -> None:
    """One profile set per context (see :class:`BuildOptions`); a fully static input needs none.

    A fixed batch dim (with open height/width) gets that batch as min, opt and max: a range there
    fails the build. Raises :class:`EngineError` when TensorRT refuses a profile (index -1).
    """
    shape = tuple(network.get_input(0).shape)
    if all(d > 0 for d in shape):
        return
    h, w = options.input_hw
    ranges = ((shape[0],) * 3,) if shape[0] > 0 else options.profiles
    for _ in range(options.contexts):
        for low, opt, high in ranges:
            profile = builder.create_optimization_profile()
            profile.set_shape(options.input_name, (low, 3, h, w), (opt, 3, h, w), (high, 3, h, w))
            if config.add_optimization_profile(profile) < 0:
                raise EngineError(f"tensorrt refused the optimization profile {low}:{opt}:{high} for "
                                  f"{options.input_name} at {h}x{w}")


def _attach_timing_cache(config: Any, path: Path | None) -> Any:
    """Kernel timings survive between builds; a corrupt or foreign cache file is ignored with a warning."""
    if path is None:
        return None
    cache = None
    data = path.read_bytes() if path.exists() else b""
    if data:
        try:
            cache = config.create_timing_cache(data)
        except (RuntimeError, TypeError, ValueError) as error:
            logger.warning("tensorrt build: timing cache %s is unreadable (%s); starting a new one", path, error)
        if cache is not None and not config.set_timing_cache(cache, ignore_mismatch=False):
            logger.warning("tensorrt build: timing cache %s is for another GPU or TensorRT; starting a new one", path)
            cache = None
    if cache is None:
        cache = config.create_timing_cache(b"")
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            logger.warning("tensorrt build: no timing cache (TensorRT refused an empty one)")
            return None
    return cache


def _attach_progress(trt: ModuleType, config: Any) -> None:
    """Log build phases through ``IProgressMonitor`` (top-level at INFO)."""
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
