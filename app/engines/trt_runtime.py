"""The seam between detstream and the ``tensorrt`` module (TensorRT ≥ 10, tensor-name API only).

Why a seam: the scheduler, graph handling, caching and fallback are the parts
that go wrong, and they must be tested on machines without a GPU. Everything
the TensorRT path asks of TensorRT goes through :class:`TrtRuntime`,
:class:`TrtModel` and :class:`TrtContext`; :class:`RealTrtRuntime` forwards
to ``tensorrt``, and tests pass a host fake that computes with numpy on
:class:`~app.engines.host_device.HostDevice` memory.

Thread ownership: a context and its stream belong to the engine thread.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from app.engines.device import Stream
from app.errors import EngineError, EngineLoadError

logger = logging.getLogger(__name__)

MIN_TRT_MAJOR = 10


@dataclass(frozen=True)
class TensorInfo:
    """One engine input/output: ``shape`` has -1 where a dim is dynamic (the batch dim, usually)."""

    name: str
    is_input: bool
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class BuildOptions:
    """What to build: ``profiles`` is one set of batch ranges ``(min, opt, max)``, repeated ``contexts`` times.

    The set is repeated because two execution contexts running at once must
    not share an optimization profile of a dynamic-shape engine; context *c*
    uses profiles ``c * len(profiles) ...``.
    """

    input_name: str
    input_hw: tuple[int, int]
    precision: str
    profiles: tuple[tuple[int, int, int], ...]
    contexts: int = 1
    calib_frames: Callable[[], Iterator[np.ndarray]] | None = None
    calib_cache: Path | None = None
    timing_cache: Path | None = None
    progress: bool = False
    workspace_bytes: int = 1 << 30


class TrtContext(Protocol):
    """An execution context (``IExecutionContext``), owned by one stream."""

    def set_optimization_profile(self, index: int, stream: Stream) -> None: ...

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None: ...

    def set_tensor_address(self, name: str, ptr: int) -> None: ...

    def execute(self, stream: Stream) -> None:
        """Enqueue inference on ``stream`` (``execute_async_v3``); raises :class:`EngineError` if refused."""
        ...


class TrtModel(Protocol):
    """A deserialized engine (``ICudaEngine``)."""

    tensors: tuple[TensorInfo, ...]
    num_profiles: int

    def profile_batch_range(self, input_name: str, index: int) -> tuple[int, int, int]: ...

    def create_context(self) -> TrtContext: ...


class TrtRuntime(Protocol):
    """Build and deserialize engines."""

    version: str

    def build(self, onnx_path: Path, options: BuildOptions) -> bytes: ...

    def deserialize(self, blob: bytes) -> TrtModel: ...


def import_tensorrt() -> ModuleType:
    """The ``tensorrt`` module, version-checked; :class:`EngineLoadError` otherwise."""
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError as error:
        raise EngineLoadError(f"tensorrt is not installed: {error}") from None
    version = str(getattr(trt, "__version__", "0"))
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < MIN_TRT_MAJOR:
        raise EngineLoadError(f"tensorrt {version} is too old (need ≥ {MIN_TRT_MAJOR}: tensor-name API)")
    return trt


def make_trt_logger(trt: ModuleType) -> Any:
    """A ``trt.ILogger`` that forwards to :mod:`logging` (TensorRT's INFO is chatty: it goes to DEBUG)."""
    severity = trt.ILogger.Severity
    levels = {
        severity.INTERNAL_ERROR: logging.CRITICAL,
        severity.ERROR: logging.ERROR,
        severity.WARNING: logging.WARNING,
        severity.INFO: logging.DEBUG,
        severity.VERBOSE: logging.DEBUG,
    }

    class TrtLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, level: Any, msg: str) -> None:
            logger.log(levels.get(level, logging.INFO), "tensorrt: %s", msg)

    return TrtLogger()


class RealTrtRuntime:
    """:class:`TrtRuntime` on the real ``tensorrt`` module."""

    def __init__(self, trt: ModuleType) -> None:
        self._trt = trt
        self.version = str(trt.__version__)
        self._logger = make_trt_logger(trt)
        self._runtime = trt.Runtime(self._logger)

    @classmethod
    def load(cls) -> RealTrtRuntime:
        return cls(import_tensorrt())

    def build(self, onnx_path: Path, options: BuildOptions) -> bytes:
        from app.engines.trt_build import build_serialized

        return build_serialized(self._trt, self._logger, onnx_path, options)

    def deserialize(self, blob: bytes) -> RealTrtModel:
        engine = self._runtime.deserialize_cuda_engine(blob)
        if engine is None:
            raise EngineError("tensorrt: deserialize_cuda_engine returned None (version or GPU mismatch?)")
        return RealTrtModel(self._trt, engine)


class RealTrtModel:
    """:class:`TrtModel` over an ``ICudaEngine``."""

    def __init__(self, trt: ModuleType, engine: Any) -> None:
        self._engine = engine
        infos = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            infos.append(TensorInfo(
                name=name,
                is_input=engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                shape=tuple(int(d) for d in engine.get_tensor_shape(name)),
                dtype=np.dtype(trt.nptype(engine.get_tensor_dtype(name))),
            ))
        self.tensors = tuple(infos)
        self.num_profiles = int(engine.num_optimization_profiles)

    def profile_batch_range(self, input_name: str, index: int) -> tuple[int, int, int]:
        low, opt, high = self._engine.get_tensor_profile_shape(input_name, index)
        return int(low[0]), int(opt[0]), int(high[0])

    def create_context(self) -> RealTrtContext:
        context = self._engine.create_execution_context()
        if context is None:
            raise EngineError("tensorrt: create_execution_context returned None (out of device memory?)")
        return RealTrtContext(context)


class RealTrtContext:
    """:class:`TrtContext` over an ``IExecutionContext``; stream handles are passed as ints."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def set_optimization_profile(self, index: int, stream: Stream) -> None:
        if not self._context.set_optimization_profile_async(index, int(stream)):
            raise EngineError(f"tensorrt: set_optimization_profile_async({index}) failed")

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._context.set_input_shape(name, shape):
            raise EngineError(f"tensorrt: set_input_shape({name}, {shape}) failed")

    def set_tensor_address(self, name: str, ptr: int) -> None:
        if not self._context.set_tensor_address(name, ptr):
            raise EngineError(f"tensorrt: set_tensor_address({name}) failed")

    def execute(self, stream: Stream) -> None:
        if not self._context.execute_async_v3(int(stream)):
            raise EngineError("tensorrt: execute_async_v3 failed")
