"""The real ``tensorrt`` module behind the :mod:`app.engines.tensorrt.runtime` seam (TensorRT ≥ 10, tensor-name API).

``tensorrt`` is an optional dependency: it is imported only by :func:`import_tensorrt`, when a TensorRT
engine is asked for, and a missing or unsupported module is an :class:`EngineLoadError` that makes
``create_engine`` fall back, with one line saying what to install.

Thread ownership: a context and its stream belong to the engine thread.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from app.engines.cuda.device import Stream, native_handle
from app.engines.tensorrt.build import build_serialized
from app.engines.tensorrt.runtime import BuildOptions, TensorInfo
from app.errors import EngineError, EngineLoadError

logger = logging.getLogger(__name__)

SUPPORTED_TRT = ((10, 13), (12, 0))
"""TensorRT from 10.13 up to, not including, 12: the API the adapters use, checked against the real
10.13/10.16 and 11.x bindings by tests/conformance."""
TRT_PIN = "tensorrt>=10.13,<12"
INSTALL_HINT = f"pip install 'detstream[tensorrt]' (or '{TRT_PIN}' with 'cuda-bindings>=12.9.1')"


def import_tensorrt() -> ModuleType:
    """The ``tensorrt`` module, version-checked; :class:`EngineLoadError` (saying what to install) otherwise."""
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError as error:
        raise EngineLoadError(f"tensorrt is not installed ({error}): {INSTALL_HINT}") from None
    version = str(getattr(trt, "__version__", "0"))
    check_trt_version(version)
    return trt


def check_trt_version(version: str) -> None:
    """Raise :class:`EngineLoadError` with a one-line install hint unless ``version`` is supported."""
    parts = [int(p) if p.isdigit() else 0 for p in [*version.split("."), "0", "0"][:2]]
    low, high = SUPPORTED_TRT
    if not low <= (parts[0], parts[1]) < high:
        raise EngineLoadError(f"tensorrt {version} is not supported (detstream needs {TRT_PIN}): {INSTALL_HINT}")


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

    def release(self) -> None:
        """Drop the ``ICudaEngine`` (the bindings destroy it with the last reference)."""
        self._engine = None


class RealTrtContext:
    """:class:`TrtContext` over an ``IExecutionContext``; streams are passed as their native handles."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def set_optimization_profile(self, index: int, stream: Stream) -> None:
        try:
            self._context.set_optimization_profile_async(index, native_handle(stream))
        except RuntimeError as error:  # the bindings raise on failure (and return True otherwise)
            raise EngineError(f"tensorrt: set_optimization_profile_async({index}) failed: {error}") from None

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._context.set_input_shape(name, shape):
            raise EngineError(f"tensorrt: set_input_shape({name}, {shape}) failed")

    def set_tensor_address(self, name: str, ptr: int) -> None:
        if not self._context.set_tensor_address(name, ptr):
            raise EngineError(f"tensorrt: set_tensor_address({name}) failed")

    def execute(self, stream: Stream) -> None:
        if not self._context.execute_async_v3(native_handle(stream)):
            raise EngineError("tensorrt: execute_async_v3 failed")

    def release(self) -> None:
        """Drop the ``IExecutionContext`` (destroyed with the last reference, before its engine)."""
        self._context = None
