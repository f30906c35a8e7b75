"""The small device interface the TensorRT path runs on, and its CUDA implementation.

The TensorRT engine needs only these calls, so they sit behind :class:`Device`:
on a GPU :class:`CudaDevice` forwards them to ``cuda.bindings.runtime``; on the
CPU the test double ``HostDevice`` (tests/unit/engines) runs them with threads as
streams, so that the scheduler, graphs and error paths are tested for real
without a GPU.

Handles are opaque: device and pinned host pointers are ``int`` (pointer
arithmetic, e.g. ``d_input + i * frame_bytes``, is allowed on them); streams,
events, graphs and graph execs are whatever the implementation returns.

Thread ownership: the engine thread (``detstream.engine``) makes every call
except :meth:`Device.event_synchronize` / :meth:`Device.event_query`, which
the postprocess thread uses to wait for a batch.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any

from app.errors import EngineError, EngineLoadError

Stream = Any
Event = Any
Graph = Any
GraphExec = Any


class Device(ABC):
    """Exactly the device calls the TensorRT path makes (see the module docstring for ownership)."""

    @abstractmethod
    def device_name(self) -> str:
        """Marketing name of the GPU (``NVIDIA H100 80GB HBM3``); part of the engine cache key."""

    @abstractmethod
    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)``; an engine built for one capability does not load on another."""

    @abstractmethod
    def malloc(self, nbytes: int) -> int:
        """Allocate device memory; returns a device pointer."""

    @abstractmethod
    def free(self, ptr: int) -> None:
        """Release memory from :meth:`malloc`."""

    @abstractmethod
    def host_alloc(self, nbytes: int) -> int:
        """Allocate page-locked host memory (DMA-able, so async copies really are async)."""

    @abstractmethod
    def host_free(self, ptr: int) -> None:
        """Release memory from :meth:`host_alloc`."""

    @abstractmethod
    def stream_create(self) -> Stream:
        """A non-blocking stream: work on it does not serialise with the legacy default stream."""

    @abstractmethod
    def stream_destroy(self, stream: Stream) -> None:
        """Release a stream (after its work is done)."""

    @abstractmethod
    def memcpy_htod_async(self, dst: int, src_host_ptr: int, nbytes: int, stream: Stream) -> None:
        """Queue a host→device copy on ``stream``; ``src_host_ptr`` must stay valid until it ran."""

    @abstractmethod
    def memcpy_dtoh_async(self, dst_host_ptr: int, src: int, nbytes: int, stream: Stream) -> None:
        """Queue a device→host copy on ``stream``."""

    @abstractmethod
    def event_create(self) -> Event:
        """An event without timing (cheaper to record and to wait on)."""

    @abstractmethod
    def event_destroy(self, event: Event) -> None:
        """Release an event."""

    @abstractmethod
    def event_record(self, event: Event, stream: Stream) -> None:
        """Mark the current end of ``stream``; the event completes when the stream gets there."""

    @abstractmethod
    def event_synchronize(self, event: Event) -> None:
        """Block until the event completed; raises :class:`EngineError` if the work before it failed."""

    @abstractmethod
    def event_query(self, event: Event) -> bool:
        """True when the event completed (never blocks)."""

    @abstractmethod
    def stream_begin_capture(self, stream: Stream) -> None:
        """Start recording work queued on ``stream`` into a graph instead of running it."""

    @abstractmethod
    def stream_end_capture(self, stream: Stream) -> Graph:
        """Stop recording; returns the captured graph."""

    @abstractmethod
    def graph_instantiate(self, graph: Graph) -> GraphExec:
        """Make a captured graph launchable."""

    @abstractmethod
    def graph_launch(self, graph_exec: GraphExec, stream: Stream) -> None:
        """Replay an instantiated graph on ``stream`` (one launch instead of many kernel launches)."""

    @abstractmethod
    def graph_destroy(self, graph: Graph) -> None:
        """Release a captured graph."""

    @abstractmethod
    def graph_exec_destroy(self, graph_exec: GraphExec) -> None:
        """Release an instantiated graph."""

    @abstractmethod
    def clear_last_error(self) -> str | None:
        """Read and reset this thread's last CUDA error (``cudaGetLastError``); its name, or None.

        A failed graph capture leaves an error behind that TensorRT's next enqueue would report as its
        own failure; clearing it (as ``trtexec`` does) lets plain enqueue go on. A sticky error (a
        kernel fault) is not cleared: it poisons the whole device context and every later call fails.
        """

    def close(self) -> None:  # noqa: B027 - optional hook: a CUDA device holds nothing of its own
        """Release what the device object itself holds (threads for :class:`HostDevice`). Idempotent."""


CUDA_BINDINGS_PIN = "cuda-bindings>=12.9.1"
"""Older cuda-python either has no ``cuda.bindings`` (12.6.0) or holds the GIL in every call, so one
thread's ``cudaEventSynchronize`` stalls every Python thread; 12.9.1 also brings
``cuda.bindings.utils.get_cuda_native_handle``."""
MIN_CUDA_BINDINGS = (12, 9, 1)


def import_cudart() -> ModuleType:
    """``cuda.bindings.runtime`` of a supported cuda-bindings; :class:`EngineLoadError` saying what to install."""
    try:
        bindings = importlib.import_module("cuda.bindings")
        runtime = importlib.import_module("cuda.bindings.runtime")
    except ImportError as error:
        raise EngineLoadError(f"cuda-bindings is not installed ({error}): pip install '{CUDA_BINDINGS_PIN}'") from None
    version = str(getattr(bindings, "__version__", "0"))
    if _version_tuple(version) < MIN_CUDA_BINDINGS:
        raise EngineLoadError(f"cuda-bindings {version} is too old: pip install '{CUDA_BINDINGS_PIN}'")
    return runtime


def native_handle(handle: Any) -> int:
    """The C handle inside a cuda-bindings object (a stream for TensorRT): ``int(handle)`` is deprecated."""
    from cuda.bindings.utils import get_cuda_native_handle

    return int(get_cuda_native_handle(handle))


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class CudaDevice(Device):
    """:class:`Device` on a real GPU through ``cuda.bindings.runtime``.

    Every call checks the returned ``cudaError_t`` and raises
    :class:`EngineError` naming the call and CUDA's error name and text.
    """

    def __init__(self, cudart: ModuleType, device_index: int = 0) -> None:
        self._rt = cudart
        self._index = device_index
        self._call("cudaSetDevice", cudart.cudaSetDevice(device_index))
        self._props = self._call("cudaGetDeviceProperties", cudart.cudaGetDeviceProperties(device_index))

    @classmethod
    def open(cls, device_index: int = 0) -> CudaDevice:
        """Import cuda-bindings, check that a device exists, select it; :class:`EngineLoadError` otherwise."""
        cudart = import_cudart()
        result = cudart.cudaGetDeviceCount()
        if result[0] != cudart.cudaError_t.cudaSuccess:
            reason = _error_name(cudart, result[0])
            raise EngineLoadError(f"no usable CUDA driver/GPU: cudaGetDeviceCount returned {reason}")
        if result[1] <= device_index:
            raise EngineLoadError(f"no CUDA device {device_index} (found {result[1]})")
        return cls(cudart, device_index)

    def _call(self, name: str, result: Any) -> Any:
        """Unpack a cuda-python result tuple ``(err, *values)``; raise on error."""
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self._rt.cudaError_t.cudaSuccess:
            raise EngineError(f"{name} failed: {_error_name(self._rt, err)}")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def device_name(self) -> str:
        name = self._props.name
        return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)).rstrip("\x00").strip()

    def compute_capability(self) -> tuple[int, int]:
        return int(self._props.major), int(self._props.minor)

    def malloc(self, nbytes: int) -> int:
        return int(self._call("cudaMalloc", self._rt.cudaMalloc(nbytes)))

    def free(self, ptr: int) -> None:
        self._call("cudaFree", self._rt.cudaFree(ptr))

    def host_alloc(self, nbytes: int) -> int:
        return int(self._call("cudaHostAlloc", self._rt.cudaHostAlloc(nbytes, self._rt.cudaHostAllocDefault)))

    def host_free(self, ptr: int) -> None:
        self._call("cudaFreeHost", self._rt.cudaFreeHost(ptr))

    def stream_create(self) -> Stream:
        flags = self._rt.cudaStreamNonBlocking
        return self._call("cudaStreamCreateWithFlags", self._rt.cudaStreamCreateWithFlags(flags))

    def stream_destroy(self, stream: Stream) -> None:
        self._call("cudaStreamDestroy", self._rt.cudaStreamDestroy(stream))

    def memcpy_htod_async(self, dst: int, src_host_ptr: int, nbytes: int, stream: Stream) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call("cudaMemcpyAsync(HtoD)", self._rt.cudaMemcpyAsync(dst, src_host_ptr, nbytes, kind, stream))

    def memcpy_dtoh_async(self, dst_host_ptr: int, src: int, nbytes: int, stream: Stream) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call("cudaMemcpyAsync(DtoH)", self._rt.cudaMemcpyAsync(dst_host_ptr, src, nbytes, kind, stream))

    def event_create(self) -> Event:
        # Blocking sync: cudaEventSynchronize sleeps instead of spinning a core (engine and postprocess threads).
        flags = self._rt.cudaEventDisableTiming | self._rt.cudaEventBlockingSync
        return self._call("cudaEventCreateWithFlags", self._rt.cudaEventCreateWithFlags(flags))

    def event_destroy(self, event: Event) -> None:
        self._call("cudaEventDestroy", self._rt.cudaEventDestroy(event))

    def event_record(self, event: Event, stream: Stream) -> None:
        self._call("cudaEventRecord", self._rt.cudaEventRecord(event, stream))

    def event_synchronize(self, event: Event) -> None:
        self._call("cudaEventSynchronize", self._rt.cudaEventSynchronize(event))

    def event_query(self, event: Event) -> bool:
        (err,) = self._rt.cudaEventQuery(event)
        if err == self._rt.cudaError_t.cudaErrorNotReady:
            return False
        self._call("cudaEventQuery", (err,))
        return True

    def stream_begin_capture(self, stream: Stream) -> None:
        # Thread-local mode: another thread's cudaMalloc/cudaHostAlloc does not invalidate our capture.
        mode = self._rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._call("cudaStreamBeginCapture", self._rt.cudaStreamBeginCapture(stream, mode))

    def stream_end_capture(self, stream: Stream) -> Graph:
        graph = self._call("cudaStreamEndCapture", self._rt.cudaStreamEndCapture(stream))
        if graph is None or not native_handle(graph):
            raise EngineError("cudaStreamEndCapture returned no graph (capture was invalidated)")
        return graph

    def graph_instantiate(self, graph: Graph) -> GraphExec:
        return self._call("cudaGraphInstantiate", self._rt.cudaGraphInstantiate(graph, 0))

    def graph_launch(self, graph_exec: GraphExec, stream: Stream) -> None:
        self._call("cudaGraphLaunch", self._rt.cudaGraphLaunch(graph_exec, stream))

    def graph_destroy(self, graph: Graph) -> None:
        self._call("cudaGraphDestroy", self._rt.cudaGraphDestroy(graph))

    def graph_exec_destroy(self, graph_exec: GraphExec) -> None:
        self._call("cudaGraphExecDestroy", self._rt.cudaGraphExecDestroy(graph_exec))

    def clear_last_error(self) -> str | None:
        (err,) = self._rt.cudaGetLastError()
        return None if err == self._rt.cudaError_t.cudaSuccess else _error_name(self._rt, err)


def _error_name(cudart: ModuleType, err: Any) -> str:
    """``cudaErrorMemoryAllocation (out of memory)`` for an error code."""
    name = cudart.cudaGetErrorName(err)
    text = cudart.cudaGetErrorString(err)
    name_s = name[1].decode() if isinstance(name, tuple) and isinstance(name[1], bytes) else str(err)
    text_s = text[1].decode() if isinstance(text, tuple) and isinstance(text[1], bytes) else ""
    return f"{name_s} ({text_s})" if text_s else name_s
