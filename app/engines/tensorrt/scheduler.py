"""Multi-context scheduling for the TensorRT path: buckets, round-robin contexts, graphs, in-order results.

One batch runs on one execution context, each context on its own stream:

    H2D frame 0..n-1 ─▶ execute (or graph launch) ─▶ D2H outputs ─▶ record event

Contexts are used round-robin, so with two contexts the copies of batch k+1
overlap the compute of batch k. A context is reused only when its previous
batch finished (its event), which bounds the batches in flight to the number
of contexts. Results come back through handles that the postprocess thread
waits on in submission order; each handle owns one pinned output set until
the *next* handle is waited on (the :class:`~app.engines.base.InferenceHandle`
contract), so there are ``contexts + 1`` sets and the consumer can hold one
while every context is busy.

Buckets: a dynamic-batch engine runs at the smallest bucket ≥ n (rows n..bucket
hold stale data whose results are dropped; samples are independent). A
static-batch engine runs ``ceil(n / b)`` steps of its batch b, each step's
input and outputs at their own :data:`TENSOR_ALIGNMENT`-aligned block of the
device buffers (TensorRT refuses unaligned tensor addresses, and a YOLO output
row is not a multiple of 256 bytes), so frame i lives in step ``i // b``.
A CUDA graph is captured per (context, bucket, step) the second time that
combination runs (the first run is TensorRT's own warm-up, which graphs
require); a capture failure is logged once and that bucket keeps plain enqueue.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from app.engines.base import InferenceHandle
from app.engines.cuda.device import Device, Event, GraphExec, Stream
from app.engines.cuda.host_memory import HostBuffer
from app.engines.tensorrt.profiles import choose_bucket
from app.engines.tensorrt.runtime import TrtContext
from app.errors import EngineError

logger = logging.getLogger(__name__)

DEFAULT_SUBMIT_TIMEOUT_S = 30.0
TENSOR_ALIGNMENT = 256
"""``IExecutionContext::setTensorAddress`` requires addresses aligned to 256 bytes."""


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`TENSOR_ALIGNMENT`."""
    return -(-nbytes // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT


def step_stride(row_bytes: int, static_batch: int | None) -> int:
    """Bytes between the blocks of consecutive static-batch steps (0 for a dynamic-batch engine: one step)."""
    return aligned(static_batch * row_bytes) if static_batch else 0


def device_bytes(rows: int, row_bytes: int, static_batch: int | None) -> int:
    """Device bytes for ``rows`` rows of ``row_bytes``: whole aligned step blocks for a static-batch engine."""
    if static_batch is None:
        return rows * row_bytes
    return math.ceil(rows / static_batch) * step_stride(row_bytes, static_batch)


def plan_steps(n: int, bucket: int, static_batch: int | None) -> list[tuple[int, int]]:
    """``(row_offset, rows)`` of each engine run for ``n`` frames."""
    if static_batch is None:
        return [(0, bucket)]
    return [(k * static_batch, static_batch) for k in range(math.ceil(n / static_batch))]


@dataclass
class ContextSlot:
    """One execution context with its stream, device buffers and graphs (owned by the engine thread)."""

    index: int
    context: TrtContext
    stream: Stream
    done: Event
    d_input: int
    d_outputs: list[int]
    profiles: list[tuple[int, int, int]]
    profile_base: int
    staging: HostBuffer
    busy: bool = False
    profile: int | None = None
    shape: int | None = None
    addressed_step: int | None = None
    warmed: set[tuple[int, int]] = field(default_factory=set)
    graphs: dict[tuple[int, int], GraphExec] = field(default_factory=dict)


@dataclass
class OutputSet:
    """Pinned host outputs for one batch, with the event that says they are filled."""

    buffers: list[HostBuffer]
    event: Event


class OutputPool:
    """``contexts + 1`` output sets; a set is free again when the consumer waited on a later handle."""

    def __init__(self, sets: list[OutputSet], timeout_s: float) -> None:
        self._free = list(sets)
        self._cond = threading.Condition()
        self._held: OutputSet | None = None
        self._timeout_s = timeout_s

    def acquire(self) -> OutputSet:
        """Runs on the engine thread; blocks while the consumer is behind (backpressure), bounded by time."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free, timeout=self._timeout_s):
                raise EngineError(f"no free output buffers for {self._timeout_s:.0f}s: results are not being consumed")
            return self._free.pop()

    def give_back(self, out: OutputSet) -> None:
        """Return a set whose batch was never handed out (submit failed)."""
        with self._cond:
            self._free.append(out)
            self._cond.notify_all()

    def consumed(self, out: OutputSet) -> None:
        """Runs on the postprocess thread: ``out`` is now being read, so the previously read set is free."""
        with self._cond:
            if self._held is out:
                return
            if self._held is not None:
                self._free.append(self._held)
            self._held = out
            self._cond.notify_all()


class TrtHandle(InferenceHandle):
    """A batch in flight on one context; ``wait`` syncs its event and returns views of its output set."""

    def __init__(self, device: Device, pool: OutputPool, out: OutputSet, n: int) -> None:
        self._device = device
        self._pool = pool
        self._out = out
        self._n = n

    def wait(self) -> list[np.ndarray]:
        self._device.event_synchronize(self._out.event)
        self._pool.consumed(self._out)
        return [buffer.array[: self._n] for buffer in self._out.buffers]


@dataclass(frozen=True)
class BatchLayout:
    """Where a batch's frames and output rows lie in a context's device buffers; fixed when the engine is set up.

    ``buckets`` are the batch sizes the engine runs at. A static-batch engine has
    the one bucket ``static_batch`` and runs ``ceil(n / static_batch)`` steps,
    each at its own aligned block (:func:`step_stride`); a dynamic-batch engine
    (``static_batch`` None) runs one step with the rows packed.
    """

    input_name: str
    frame_shape: tuple[int, ...]
    frame_dtype: np.dtype
    output_names: tuple[str, ...]
    output_row_bytes: tuple[int, ...]
    buckets: tuple[int, ...]
    static_batch: int | None

    @cached_property
    def frame_bytes(self) -> int:
        return math.prod(self.frame_shape) * self.frame_dtype.itemsize

    @cached_property
    def input_stride(self) -> int:
        return step_stride(self.frame_bytes, self.static_batch)

    @cached_property
    def output_strides(self) -> tuple[int, ...]:
        return tuple(step_stride(row_bytes, self.static_batch) for row_bytes in self.output_row_bytes)

    def frame_offset(self, i: int) -> int:
        """Byte offset of frame ``i`` of a batch in the device input buffer."""
        if self.static_batch is None:
            return i * self.frame_bytes
        step, row = divmod(i, self.static_batch)
        return step * self.input_stride + row * self.frame_bytes

    def input_device_bytes(self, rows: int) -> int:
        """Device bytes of the input buffer of a context that holds ``rows`` frames."""
        return device_bytes(rows, self.frame_bytes, self.static_batch)

    def output_device_bytes(self, rows: int) -> list[int]:
        """Device bytes of each output buffer of a context that holds ``rows`` frames."""
        return [device_bytes(rows, row_bytes, self.static_batch) for row_bytes in self.output_row_bytes]


class BatchScheduler:
    """Runs batches on the context slots (see the module docstring). Runs on the engine thread."""

    def __init__(self, device: Device, slots: list[ContextSlot], pool: OutputPool, layout: BatchLayout, *,
                 use_graphs: bool) -> None:
        self._device = device
        self.slots = slots
        self._pool = pool
        self.layout = layout
        self.max_frames = layout.buckets[-1] if layout.static_batch is None else slots[0].staging.array.shape[0]
        self._use_graphs = use_graphs
        self._graph_failures: set[int] = set()
        self._next = 0

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.layout.buckets

    @property
    def static_batch(self) -> int | None:
        return self.layout.static_batch

    def submit(self, frames: Sequence[np.ndarray]) -> TrtHandle:
        n = len(frames)
        if not 0 < n <= self.max_frames:
            raise ValueError(f"TensorRT submit: {n} frames (allowed 1..{self.max_frames})")
        bucket = self.static_batch or choose_bucket(n, self.buckets)
        slot = self.slots[self._next % len(self.slots)]
        self._next += 1
        if slot.busy:
            self._device.event_synchronize(slot.done)
        out = self._pool.acquire()
        try:
            self._copy_in(slot, frames)
            for step, (offset, rows) in enumerate(plan_steps(n, bucket, self.static_batch)):
                self._prepare(slot, bucket, step, offset, rows)
                self._execute(slot, bucket, step)
            self._copy_out(slot, out, n)
            self._device.event_record(out.event, slot.stream)
            self._device.event_record(slot.done, slot.stream)
            slot.busy = True
        except Exception:
            self._pool.give_back(out)
            raise
        return TrtHandle(self._device, self._pool, out, n)

    def _copy_in(self, slot: ContextSlot, frames: Sequence[np.ndarray]) -> None:
        """H2D each frame straight from its ring slot (a contiguous view) to its row of the device input."""
        layout = self.layout
        for i, frame in enumerate(frames):
            if frame.shape != layout.frame_shape:
                raise ValueError(f"frame {i}: shape {frame.shape}, engine input is {layout.frame_shape}")
            if frame.dtype != layout.frame_dtype or not frame.flags.c_contiguous:
                staged = slot.staging.array[i]
                np.copyto(staged, frame, casting="same_kind")
                frame = staged
            dst = slot.d_input + layout.frame_offset(i)
            self._device.memcpy_htod_async(dst, frame.ctypes.data, layout.frame_bytes, slot.stream)

    def _prepare(self, slot: ContextSlot, bucket: int, step: int, offset: int, rows: int) -> None:
        """Profile, input shape and tensor addresses for this step; each set only when it changes."""
        layout = self.layout
        profile = slot.profile_base + _profile_index(slot.profiles, rows)
        if slot.profile != profile:
            slot.context.set_optimization_profile(profile, slot.stream)
            slot.profile, slot.shape, slot.addressed_step = profile, None, None
        if slot.shape != rows:
            slot.context.set_input_shape(layout.input_name, (rows, *layout.frame_shape))
            slot.shape = rows
        if slot.addressed_step != step:
            slot.context.set_tensor_address(layout.input_name, slot.d_input + step * layout.input_stride)
            for name, ptr, stride in zip(layout.output_names, slot.d_outputs, layout.output_strides, strict=True):
                slot.context.set_tensor_address(name, ptr + step * stride)
            slot.addressed_step = step

    def _execute(self, slot: ContextSlot, bucket: int, step: int) -> None:
        key = (bucket, step)
        graph = slot.graphs.get(key)
        if graph is not None:
            self._device.graph_launch(graph, slot.stream)
            return
        if self._use_graphs and key in slot.warmed and bucket not in self._graph_failures:
            graph = self._capture(slot, bucket)
            if graph is not None:
                slot.graphs[key] = graph
                self._device.graph_launch(graph, slot.stream)
                return
        slot.context.execute(slot.stream)
        slot.warmed.add(key)

    def _capture(self, slot: ContextSlot, bucket: int) -> GraphExec | None:
        """Capture one enqueue as a graph; None (logged once per bucket) when capture does not work."""
        capturing = False
        try:
            self._device.stream_begin_capture(slot.stream)
            capturing = True
            slot.context.execute(slot.stream)
            capturing = False
            graph = self._device.stream_end_capture(slot.stream)
            try:
                return self._device.graph_instantiate(graph)
            finally:
                self._device.graph_destroy(graph)
        except EngineError as error:
            if capturing:
                self._abandon_capture(slot)
            # A failed capture leaves CUDA's last error set; TensorRT's next enqueue would report it as its own.
            leftover = self._device.clear_last_error()
            if leftover:
                logger.debug("cleared CUDA error %s left by the failed capture", leftover)
            if bucket not in self._graph_failures:
                self._graph_failures.add(bucket)
                logger.warning("CUDA graph capture failed for batch %d (%s); using plain enqueue", bucket, error)
            return None

    def _abandon_capture(self, slot: ContextSlot) -> None:
        try:
            self._device.graph_destroy(self._device.stream_end_capture(slot.stream))
        except EngineError as error:
            logger.debug("ending a failed capture on context %d: %s", slot.index, error)

    def _copy_out(self, slot: ContextSlot, out: OutputSet, n: int) -> None:
        layout = self.layout
        outputs = zip(out.buffers, slot.d_outputs, layout.output_row_bytes, layout.output_strides, strict=True)
        for buffer, ptr, row_bytes, stride in outputs:
            if self.static_batch is None:
                self._device.memcpy_dtoh_async(buffer.ptr, ptr, n * row_bytes, slot.stream)
                continue
            for step, (offset, _) in enumerate(plan_steps(n, self.static_batch, self.static_batch)):
                rows = min(self.static_batch, n - offset)
                self._device.memcpy_dtoh_async(buffer.ptr + offset * row_bytes, ptr + step * stride,
                                               rows * row_bytes, slot.stream)


def _profile_index(profiles: list[tuple[int, int, int]], rows: int) -> int:
    for index, (low, _, high) in enumerate(profiles):
        if low <= rows <= high:
            return index
    raise EngineError(f"no optimization profile covers batch {rows} (profiles {profiles})")
