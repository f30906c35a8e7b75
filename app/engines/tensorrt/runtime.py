"""The seam between detstream and the ``tensorrt`` module: what the TensorRT path asks of TensorRT.

Why a seam: the scheduler, graph handling, caching and fallback are the parts
that go wrong, and they must be tested on machines without a GPU. Everything
the TensorRT path asks of TensorRT goes through :class:`TrtRuntime`,
:class:`TrtModel` and :class:`TrtContext`; :mod:`app.engines.tensorrt.adapter`
forwards them to the real ``tensorrt`` module, and tests pass a host fake that
computes with numpy on a host simulation of the device.

Thread ownership: a context and its stream belong to the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from app.engines.cuda.device import Stream


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

    ``precision`` names the model's precision (for logs): the network is strongly typed, so the ONNX
    file handed to :meth:`TrtRuntime.build` decides it.

    The set is repeated because two execution contexts running at once must
    not share an optimization profile of a dynamic-shape engine; context *c*
    uses profiles ``c * len(profiles) ...``.
    """

    input_name: str
    input_hw: tuple[int, int]
    precision: str
    profiles: tuple[tuple[int, int, int], ...]
    contexts: int = 1
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

    def release(self) -> None:
        """Destroy the context (its device memory and profile go back to the engine). Idempotent."""
        ...


class TrtModel(Protocol):
    """A deserialized engine (``ICudaEngine``)."""

    tensors: tuple[TensorInfo, ...]
    num_profiles: int

    def profile_batch_range(self, input_name: str, index: int) -> tuple[int, int, int]: ...

    def create_context(self) -> TrtContext: ...

    def release(self) -> None:
        """Destroy the engine (after its contexts). Idempotent."""
        ...


class TrtRuntime(Protocol):
    """Build and deserialize engines."""

    version: str

    def build(self, onnx_path: Path, options: BuildOptions) -> bytes: ...

    def deserialize(self, blob: bytes) -> TrtModel: ...
