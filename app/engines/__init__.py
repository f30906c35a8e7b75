"""Inference engines and the one place that chooses between them.

``create_engine`` tries TensorRT for ``backend: auto`` and ``backend:
tensorrt``: package import, GPU, cached or freshly built engine, execution
contexts, warm-up. Any failure on that path falls back to ONNX Runtime (TensorRT
EP → CUDA EP → CPU EP) with exactly one WARNING naming the reason and the
backend now in use, e.g.::

    tensorrt unavailable: tensorrt is not installed: No module named 'tensorrt'; using onnxruntime:CPUExecutionProvider

An explicit ``backend: tensorrt`` falls back too (the pipeline keeps running;
the result messages name the real backend in their ``engine`` field) but the
line says "tensorrt requested but unavailable". ``backend: onnxruntime``
never touches TensorRT or CUDA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle
from app.engines.device import CudaDevice, Device
from app.engines.onnxruntime import OrtEngine
from app.engines.trt_runtime import RealTrtRuntime, TrtRuntime
from app.errors import EngineError, EngineLoadError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DeviceFactory = Callable[[], Device]
TrtFactory = Callable[[], TrtRuntime]

__all__ = ["BACKENDS", "Engine", "InferenceHandle", "OrtEngine", "create_engine", "default_cache_dir", "detect_cuda"]


def create_engine(
    spec: ModelSpec,
    config: EngineConfig,
    *,
    device_factory: DeviceFactory | None = None,
    trt_factory: TrtFactory | None = None,
) -> Engine:
    """The engine for ``spec`` as ``config.backend`` asks, falling back to ONNX Runtime (see the module docstring).

    Every engine returned has run its warm-up (:meth:`Engine.warmup`), so that the first frames are not slow.

    ``device_factory`` and ``trt_factory`` replace :meth:`CudaDevice.open` and
    :meth:`RealTrtRuntime.load` (tests pass a HostDevice and a host fake).
    Raises :class:`EngineLoadError` only when ONNX Runtime cannot load the model either.
    """
    return BACKENDS[config.backend](spec, config, device_factory, trt_factory)


def _onnxruntime(spec: ModelSpec, config: EngineConfig, _d: DeviceFactory | None, _t: TrtFactory | None) -> Engine:
    engine = _warm(OrtEngine(spec, config))
    logger.info("engine: %s for %s", engine.backend, spec.name)
    return engine


def _warm(engine: OrtEngine) -> OrtEngine:
    """``engine`` after its warm-up runs, so that the pipeline's first live frames do not pay for them.

    On the CUDA provider the first run of a shape searches cuDNN's convolution algorithms: 1.2 s for
    yolov3-tiny on an H100, during which 16 live cameras each dropped 7-8 frames when the first real
    batch paid for it. A warm-up that fails means the model cannot run here: :class:`EngineLoadError`.
    """
    t0 = time.monotonic()
    try:
        engine.warmup()
    except EngineError as error:
        engine.close()
        raise EngineLoadError(f"{engine.backend}: the warm-up run on {engine.spec.path} failed: {error}") from None
    logger.info("engine: %s warmed up in %.2f s", engine.backend, time.monotonic() - t0)
    return engine


def _tensorrt_or_fallback(
    spec: ModelSpec, config: EngineConfig, device_factory: DeviceFactory | None, trt_factory: TrtFactory | None
) -> Engine:
    try:
        engine = _open_tensorrt(spec, config, device_factory or CudaDevice.open, trt_factory or RealTrtRuntime.load)
    except Exception as error:  # any TensorRT failure means fallback; the reason is logged below
        reason = _one_line(error)
    else:
        logger.info("engine: %s for %s", engine.backend, spec.name)
        return engine
    try:
        fallback = _warm(OrtEngine(spec, config))
    except EngineLoadError as error:
        raise EngineLoadError(f"no inference backend for {spec.path}: tensorrt: {reason}; {error}") from None
    prefix = "tensorrt requested but unavailable" if config.backend == "tensorrt" else "tensorrt unavailable"
    logger.warning("%s: %s; using %s", prefix, reason, fallback.backend)
    return fallback


def _open_tensorrt(
    spec: ModelSpec, config: EngineConfig, device_factory: DeviceFactory, trt_factory: TrtFactory
) -> Engine:
    from app.engines.tensorrt import open_tensorrt_engine

    runtime = trt_factory()
    device = device_factory()
    try:
        engine = open_tensorrt_engine(spec, config, device, runtime, default_cache_dir(config))
    except BaseException:
        device.close()
        raise
    engine.owns_device = True
    return engine


BACKENDS: Mapping[str, Callable[..., Engine]] = MappingProxyType({
    "auto": _tensorrt_or_fallback,
    "tensorrt": _tensorrt_or_fallback,
    "onnxruntime": _onnxruntime,
})


def default_cache_dir(config: EngineConfig) -> Path:
    """``engine.cache_dir``, or ``~/.cache/detstream/engines``."""
    return Path(config.cache_dir).expanduser() if config.cache_dir else Path.home() / ".cache" / "detstream" / "engines"


def detect_cuda() -> str | None:
    """None when a CUDA GPU is usable through cuda-python here, else the reason (for the CLI and README)."""
    try:
        device = CudaDevice.open()
    except EngineError as error:
        return str(error)
    device.close()
    return None


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(error, EngineError):
        return message or type(error).__name__
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
