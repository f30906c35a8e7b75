"""HostDevice: the :class:`~app.engines.cuda.device.Device` calls carried out on the CPU, for tests.

It behaves like CUDA where the scheduler can tell the difference:

* "device memory" is numpy byte arrays at fake integer addresses, so pointer
  arithmetic works and a bad pointer raises instead of corrupting memory;
* a stream is a worker thread (``detstream.hostdevice.stream<N>``) running a
  FIFO of queued operations, so copies and kernels of different streams really
  overlap and work on one stream really is ordered;
* an event completes when its stream reaches it; a failed operation poisons
  the whole device, every stream (sticky, like a CUDA kernel fault, which
  corrupts the context): later work does not run, the next
  :meth:`event_synchronize` on any stream raises :class:`EngineError`, and so
  do later copies, allocations, launches and captures;
* a failed capture leaves a non-sticky "last error" behind
  (:meth:`HostDevice.peek_last_error`), which the fake TensorRT context
  reports as its own failure until :meth:`HostDevice.clear_last_error`
  (``cudaGetLastError``) reads and resets it;
* capture records the operations queued on the stream into a graph, and a
  launch of the instantiated graph queues them again (same pointers, same
  functions), which is exactly what a CUDA graph replays.

``fail_on={"malloc": 2, "capture": 1, "execute": 1}`` makes the N-th and every
later call of that kind fail, so tests can break each step of engine set-up
and of a batch. Kinds: ``device_query``, ``malloc``, ``host_alloc``,
``stream_create``, ``memcpy``, ``capture``, ``instantiate``, ``launch``, and
the kinds of operations queued through :meth:`HostDevice.enqueue` (the fake
TensorRT context uses ``execute``), which fail when the stream runs them.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from app.engines.cuda.device import Device
from app.errors import EngineError
from app.threads import StageThread

_ALIGN = 256
_BASE_ADDRESS = 1 << 40
_STREAM_QUEUE_SIZE = 4096
_JOIN_TIMEOUT_S = 5.0


@dataclass
class _Op:
    kind: str
    fn: Callable[[], None]


@dataclass
class HostGraph:
    """Operations recorded between begin and end of a capture."""

    ops: list[_Op] = field(default_factory=list)


@dataclass(frozen=True)
class HostGraphExec:
    """An instantiated graph: a frozen copy of the recorded operations."""

    ops: tuple[_Op, ...]


class HostEvent:
    """Completion marker; ``error`` is the stream's failure when it was reached."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._recorded = 0
        self._reached = 0
        self._error: Exception | None = None

    def _arm(self) -> int:
        with self._cond:
            self._recorded += 1
            return self._recorded

    def _signal(self, ticket: int, error: Exception | None) -> None:
        with self._cond:
            self._reached = max(self._reached, ticket)
            self._error = error
            self._cond.notify_all()

    def done(self) -> bool:
        with self._cond:
            return self._reached >= self._recorded

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._reached >= self._recorded)
            if self._error is not None:
                raise EngineError(f"event: earlier work on the stream failed: {self._error}")


class _Fault:
    """The device-wide sticky error: set by the first failed operation on any stream."""

    def __init__(self) -> None:
        self.error: Exception | None = None


class HostStream:
    """A FIFO of operations run by one named worker thread."""

    def __init__(self, number: int, fault: _Fault | None = None) -> None:
        self.name = f"detstream.hostdevice.stream{number}"
        self.capture: HostGraph | None = None
        self._fault = fault or _Fault()
        self._queue: queue.Queue[_Op | None] = queue.Queue(maxsize=_STREAM_QUEUE_SIZE)
        self._thread = StageThread(self._run, self.name)
        self._thread.start()

    def put(self, op: _Op) -> None:
        if self.capture is not None:
            self.capture.ops.append(op)
        else:
            self._queue.put(op)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=_JOIN_TIMEOUT_S)

    def _run(self) -> None:
        """Runs on thread ``detstream.hostdevice.stream<N>``: execute ops in order; errors are sticky."""
        while True:
            op = self._queue.get()
            if op is None:
                return
            if self._fault.error is not None and op.kind != "event":
                continue  # sticky, like a CUDA kernel fault: later work on the device does not run
            try:
                op.fn()
            except Exception as error:  # becomes the device's sticky error, raised at the next sync
                if self._fault.error is None:
                    self._fault.error = error

    @property
    def error(self) -> Exception | None:
        """The device's sticky error, if any (a fault on any stream poisons them all)."""
        return self._fault.error


class HostDevice(Device):
    """:class:`Device` on the CPU (see the module docstring); ``close()`` stops the stream threads."""

    def __init__(
        self,
        *,
        name: str = "HostDevice",
        capability: tuple[int, int] = (0, 0),
        fail_on: Mapping[str, int] | None = None,
    ) -> None:
        self._name = name
        self._capability = capability
        self._fail_on = dict(fail_on or {})
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._bases: list[int] = []
        self._blocks: dict[int, np.ndarray] = {}
        self._host_blocks: dict[int, np.ndarray] = {}
        self._next_address = _BASE_ADDRESS
        self._stream_numbers = itertools.count()
        self._streams: list[HostStream] = []
        self._fault = _Fault()
        self._last_error: str | None = None

    # --- fault injection -------------------------------------------------
    def _maybe_fail(self, kind: str) -> None:
        with self._lock:
            count = self._calls[kind] = self._calls.get(kind, 0) + 1
        threshold = self._fail_on.get(kind)
        if threshold is not None and count >= threshold:
            raise EngineError(f"HostDevice: injected {kind} failure (call {count})")

    def _check_sticky(self, what: str) -> None:
        if self._fault.error is not None:
            raise EngineError(f"HostDevice.{what}: the device is in a sticky error state ({self._fault.error})")

    @property
    def faulted(self) -> bool:
        """True once an operation failed on any stream (the context is unusable, as in CUDA)."""
        return self._fault.error is not None

    def set_last_error(self, name: str) -> None:
        """Leave a non-sticky error for the next :meth:`clear_last_error` (what a failed capture does)."""
        self._last_error = name

    def peek_last_error(self) -> str | None:
        return self._last_error

    def clear_last_error(self) -> str | None:
        error, self._last_error = self._last_error, None
        return error

    def calls(self, kind: str) -> int:
        """How often ``kind`` was called (tests assert on it)."""
        with self._lock:
            return self._calls.get(kind, 0)

    # --- queries -----------------------------------------------------------
    def device_name(self) -> str:
        self._maybe_fail("device_query")
        return self._name

    def compute_capability(self) -> tuple[int, int]:
        self._maybe_fail("device_query")
        return self._capability

    # --- memory ------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        self._maybe_fail("malloc")
        self._check_sticky("malloc")
        with self._lock:
            ptr = self._next_address
            self._next_address += -(-max(nbytes, 1) // _ALIGN) * _ALIGN + _ALIGN  # a gap catches overruns
            bisect.insort(self._bases, ptr)
            self._blocks[ptr] = np.zeros(max(nbytes, 1), np.uint8)
        return ptr

    def free(self, ptr: int) -> None:
        with self._lock:
            if ptr not in self._blocks:
                raise EngineError(f"HostDevice.free: {ptr:#x} is not an allocation")
            del self._blocks[ptr]
            self._bases.remove(ptr)

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """The ``nbytes`` of device memory at ``ptr`` as a writable uint8 array (for host kernels)."""
        with self._lock:
            index = bisect.bisect_right(self._bases, ptr) - 1
            base = self._bases[index] if index >= 0 else None
            block = self._blocks.get(base) if base is not None else None
        if block is None or ptr + nbytes > base + block.nbytes:
            raise EngineError(f"HostDevice: invalid device range {ptr:#x}+{nbytes}")
        return block[ptr - base : ptr - base + nbytes]

    def host_alloc(self, nbytes: int) -> int:
        self._maybe_fail("host_alloc")
        raw = np.zeros(max(nbytes, 1) + 64, np.uint8)
        offset = (-raw.ctypes.data) % 64
        ptr = raw.ctypes.data + offset
        with self._lock:
            self._host_blocks[ptr] = raw
        return ptr

    def host_free(self, ptr: int) -> None:
        with self._lock:
            if self._host_blocks.pop(ptr, None) is None:
                raise EngineError(f"HostDevice.host_free: {ptr:#x} is not a host allocation")

    # --- streams and copies ------------------------------------------------
    def stream_create(self) -> HostStream:
        self._maybe_fail("stream_create")
        stream = HostStream(next(self._stream_numbers), self._fault)
        with self._lock:
            self._streams.append(stream)
        return stream

    def stream_destroy(self, stream: HostStream) -> None:
        stream.stop()
        with self._lock:
            if stream in self._streams:
                self._streams.remove(stream)

    def enqueue(self, stream: HostStream, fn: Callable[[], None], kind: str = "kernel") -> None:
        """Queue a host function as a "kernel"; it fails on the stream when ``fail_on`` names ``kind``."""

        def run() -> None:
            self._maybe_fail(kind)
            fn()

        self._check_sticky("enqueue")
        stream.put(_Op(kind, run))

    def memcpy_htod_async(self, dst: int, src_host_ptr: int, nbytes: int, stream: HostStream) -> None:
        self._maybe_fail("memcpy")
        self._check_sticky("memcpy")
        target = self.view(dst, nbytes)
        stream.put(_Op("memcpy", lambda: ctypes.memmove(target.ctypes.data, src_host_ptr, nbytes)))

    def memcpy_dtoh_async(self, dst_host_ptr: int, src: int, nbytes: int, stream: HostStream) -> None:
        self._maybe_fail("memcpy")
        self._check_sticky("memcpy")
        source = self.view(src, nbytes)
        stream.put(_Op("memcpy", lambda: ctypes.memmove(dst_host_ptr, source.ctypes.data, nbytes)))

    # --- events ------------------------------------------------------------
    def event_create(self) -> HostEvent:
        return HostEvent()

    def event_destroy(self, event: HostEvent) -> None:
        """Nothing to release: a HostEvent is garbage collected."""

    def event_record(self, event: HostEvent, stream: HostStream) -> None:
        ticket = event._arm()
        stream.put(_Op("event", lambda: event._signal(ticket, stream.error)))

    def event_synchronize(self, event: HostEvent) -> None:
        event.wait()

    def event_query(self, event: HostEvent) -> bool:
        return event.done()

    # --- graphs ------------------------------------------------------------
    def stream_begin_capture(self, stream: HostStream) -> None:
        self._check_sticky("stream_begin_capture")
        try:
            self._maybe_fail("capture")
        except EngineError:
            self.set_last_error("cudaErrorStreamCaptureUnsupported")
            raise
        if stream.capture is not None:
            raise EngineError(f"HostDevice: {stream.name} is already capturing")
        stream.capture = HostGraph()

    def stream_end_capture(self, stream: HostStream) -> HostGraph:
        graph, stream.capture = stream.capture, None
        if graph is None:
            raise EngineError(f"HostDevice: {stream.name} is not capturing")
        return graph

    def graph_instantiate(self, graph: HostGraph) -> HostGraphExec:
        self._maybe_fail("instantiate")
        return HostGraphExec(tuple(graph.ops))

    def graph_launch(self, graph_exec: HostGraphExec, stream: HostStream) -> None:
        self._maybe_fail("launch")
        self._check_sticky("graph_launch")
        for op in graph_exec.ops:
            stream.put(op)

    def graph_destroy(self, graph: HostGraph) -> None:
        graph.ops.clear()

    def graph_exec_destroy(self, graph_exec: HostGraphExec) -> None:
        """Nothing to release: the exec only holds references."""

    def close(self) -> None:
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.stop()
