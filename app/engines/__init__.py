"""Inference engines: the backend registry and the one place that chooses between backends.

Each backend is a package behind the :class:`~app.engines.base.Engine` interface
(:mod:`app.engines.tensorrt`, :mod:`app.engines.onnxruntime`), registered in :data:`BACKENDS` under the
name ``engine.backend`` uses and its settings section uses (``engine.tensorrt``, ``engine.onnxruntime``).
:data:`PLANS` says which backends each ``engine.backend`` value tries, in order. Neither backend imports
the other; what both need lives beside them (:mod:`app.engines.base`, :mod:`app.engines.shapes`,
:mod:`app.engines.cuda`).

``create_engine`` tries TensorRT for ``backend: auto`` and ``backend: tensorrt``: package import, GPU,
cached or freshly built engine, execution contexts, warm-up. Any failure on that path falls back to
ONNX Runtime (TensorRT EP → CUDA EP → CPU EP) with exactly one WARNING naming the reason and the
backend now in use, e.g.::

    tensorrt unavailable: tensorrt is not installed: No module named 'tensorrt'; using onnxruntime:CPUExecutionProvider

An explicit ``backend: tensorrt`` falls back too (the pipeline keeps running; the result messages
name the real backend in their ``engine`` field) but the line says "tensorrt requested but
unavailable". ``backend: onnxruntime`` never touches TensorRT or CUDA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle
from app.engines.cuda.device import CudaDevice, Device
from app.engines.onnxruntime import OrtEngine
from app.engines.tensorrt import open_tensorrt_engine
from app.engines.tensorrt.adapter import RealTrtRuntime
from app.engines.tensorrt.runtime import TrtRuntime
from app.errors import EngineError, EngineLoadError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DeviceFactory = Callable[[], Device]
TrtFactory = Callable[[], TrtRuntime]

__all__ = ["BACKENDS", "PLANS", "Engine", "InferenceHandle", "create_engine", "detect_cuda"]


@dataclass(frozen=True)
class Factories:
    """How a backend reaches the machine: tests pass a host device and a fake TensorRT."""

    device: DeviceFactory
    trt: TrtFactory


def create_engine(
    spec: ModelSpec,
    config: EngineConfig,
    *,
    device_factory: DeviceFactory | None = None,
    trt_factory: TrtFactory | None = None,
) -> Engine:
    """The engine for ``spec`` as ``config.backend`` asks, falling back to ONNX Runtime (see the module docstring).

    Every engine returned has run its warm-up (:meth:`Engine.warmup`), so that the first frames are not slow.
    ``device_factory`` and ``trt_factory`` replace :meth:`CudaDevice.open` and :meth:`RealTrtRuntime.load`.
    Raises :class:`EngineLoadError` only when the last backend of the plan cannot load the model either.
    """
    factories = Factories(device_factory or CudaDevice.open, trt_factory or RealTrtRuntime.load)
    first, *rest = PLANS[config.backend]
    try:
        engine = BACKENDS[first](spec, config, factories)
    except Exception as error:  # any failure of a backend with a fallback means fallback; logged below
        if not rest:
            raise
        reason = _one_line(error)
    else:
        logger.info("engine: %s for %s", engine.backend, spec.name)
        return engine
    fallback_name = rest[0]
    try:
        fallback = BACKENDS[fallback_name](spec, config, factories)
    except EngineLoadError as error:
        raise EngineLoadError(f"no inference backend for {spec.path}: {first}: {reason}; {error}") from None
    prefix = f"{first} requested but unavailable" if config.backend == first else f"{first} unavailable"
    logger.warning("%s: %s; using %s", prefix, reason, fallback.backend)
    return fallback


def _onnxruntime(spec: ModelSpec, config: EngineConfig, _factories: Factories) -> Engine:
    """ONNX Runtime, warmed up: on the CUDA provider the first run of a shape searches cuDNN's convolution
    algorithms for long enough that live cameras would drop frames if the first real batch paid for it.
    A warm-up that fails means the model cannot run here: :class:`EngineLoadError`."""
    engine = OrtEngine(spec, config)
    t0 = time.monotonic()
    try:
        engine.warmup()
    except EngineError as error:
        engine.close()
        raise EngineLoadError(f"{engine.backend}: the warm-up run on {engine.spec.path} failed: {error}") from None
    logger.info("engine: %s warmed up in %.2f s", engine.backend, time.monotonic() - t0)
    return engine


def _tensorrt(spec: ModelSpec, config: EngineConfig, factories: Factories) -> Engine:
    """TensorRT on a device of its own (closed with the engine); warmed up by :func:`open_tensorrt_engine`."""
    runtime = factories.trt()
    device = factories.device()
    try:
        engine = open_tensorrt_engine(spec, config, device, runtime, config.tensorrt.engine_cache_dir)
    except BaseException:
        device.close()
        raise
    engine.owns_device = True
    return engine


BACKENDS: Mapping[str, Callable[[ModelSpec, EngineConfig, Factories], Engine]] = MappingProxyType({
    "tensorrt": _tensorrt,
    "onnxruntime": _onnxruntime,
})
"""Backend name → a function that opens it, warmed up; raises when the backend cannot run here."""

PLANS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "auto": ("tensorrt", "onnxruntime"),
    "tensorrt": ("tensorrt", "onnxruntime"),
    "onnxruntime": ("onnxruntime",),
})
"""``engine.backend`` → the backends tried, in order: the first that opens is used, the second is the fallback."""


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
