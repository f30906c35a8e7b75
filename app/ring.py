"""FrameRing: a fixed pool of model-input buffers, allocated once.

Each slot moves FREE → FILLING (a decoder letterboxes into it) → READY (queued
for a batch) → IN_FLIGHT (the engine reads it) → FREE (postprocess is done).
Exactly one thread owns a slot in each state, so the pixels are never copied
between stages and steady state allocates nothing. Free slots are handed out
last-in first-out: slots the pipeline never needs at once are never written,
so their pages never become resident (8 cameras at 5 fps keep a handful of
their 24 slots busy). A slot holds one frame in the engine's
:class:`~app.types.FrameFormat`: ``(3, H, W)`` float32 for ONNX Runtime and
TensorRT, ``(H, W, 3)`` uint8 for OpenVINO. The memory comes from an
allocator: page-locked (``cudaHostAlloc``) when CUDA is usable, so that H2D
copies are DMA; 64-byte-aligned numpy otherwise.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from app.errors import StateError
from app.types import FLOAT_CHW, FrameFormat, FrameMeta

Allocator = Callable[[tuple[int, ...]], np.ndarray]


class SlotState(IntEnum):
    FREE = 0
    FILLING = 1
    READY = 2
    IN_FLIGHT = 3


_NEXT_STATE = {
    SlotState.FREE: (SlotState.FILLING,),
    SlotState.FILLING: (SlotState.READY, SlotState.FREE),
    SlotState.READY: (SlotState.IN_FLIGHT, SlotState.FREE, SlotState.FILLING),
    SlotState.IN_FLIGHT: (SlotState.FREE,),
}


@dataclass(eq=False)
class Slot:
    """One preallocated frame buffer (in the ring's :class:`~app.types.FrameFormat`, told by its dtype) and the
    frame it currently holds.

    ``buffer`` is the whole preallocated slot (the model's largest input);
    ``array`` is the frame's input as the engine sees it: ``buffer`` itself, or
    a smaller contiguous ``(3, h, w)`` (``(h, w, 3)``) view of its first bytes
    when the frame was letterboxed to a rectangular input (:meth:`shape_to`).
    """

    index: int
    buffer: np.ndarray
    state: SlotState = SlotState.FREE
    owner: str = ""
    meta: FrameMeta | None = field(default=None, repr=False)
    array: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.array = self.buffer

    def shape_to(self, height: int, width: int) -> np.ndarray:
        """Make ``array`` a contiguous ``(3, height, width)`` (``(height, width, 3)``) view of the buffer
        (runs on the filling thread)."""
        fmt = FrameFormat.of(self.buffer)
        if fmt.hw(self.array.shape) != (height, width):
            max_h, max_w = fmt.hw(self.buffer.shape)
            if height > max_h or width > max_w:
                raise ValueError(f"slot {self.index}: {height}x{width} does not fit the ring's {max_h}x{max_w} slots")
            self.array = self.buffer.reshape(-1)[: 3 * height * width].reshape(fmt.shape(height, width))
        return self.array


def aligned_empty(shape: tuple[int, ...], alignment: int = 64, dtype: str = "float32") -> np.ndarray:
    """An array (float32 unless told) whose data starts on an ``alignment``-byte boundary (SIMD and DMA
    friendly)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


class FrameRing:
    """The pool of slots; thread-safe transitions guarded by one lock.

    ``owner`` records which stream holds a slot, so that per-stream quotas
    (fairness) can be enforced by the batcher.
    """

    def __init__(self, slots: int, height: int, width: int, allocator: Allocator | None = None,
                 frame_format: FrameFormat = FLOAT_CHW) -> None:
        if slots < 1:
            raise ValueError(f"FrameRing needs at least one slot, got {slots}")
        shape = (slots, *frame_format.shape(height, width))
        self.buffer = allocator(shape) if allocator else aligned_empty(shape, dtype=frame_format.dtype)
        if self.buffer.dtype != np.dtype(frame_format.dtype):
            raise ValueError(f"FrameRing: the allocator made {self.buffer.dtype} slots for {frame_format.dtype} frames")
        self.slots = [Slot(i, self.buffer[i]) for i in range(slots)]
        self._free: deque[int] = deque(range(slots))
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def occupancy(self) -> float:
        """Fraction of slots not free (a gauge for metrics)."""
        return 1.0 - len(self._free) / len(self.slots)

    def try_acquire(self, owner: str) -> Slot | None:
        """Take a free slot for filling, or None at once when there is none."""
        with self._lock:
            return self._take_free(owner)

    def acquire(self, owner: str, timeout_s: float) -> Slot | None:
        """Take a free slot, waiting up to ``timeout_s``; None if none freed in time."""
        with self._freed:
            if not self._free:
                self._freed.wait_for(lambda: bool(self._free), timeout=timeout_s)
            return self._take_free(owner)

    def _take_free(self, owner: str) -> Slot | None:
        if not self._free:
            return None
        slot = self.slots[self._free.pop()]  # LIFO: the most recently freed slot, whose pages are resident
        slot.state, slot.owner, slot.meta = SlotState.FILLING, owner, None
        return slot

    def transition(self, slot: Slot, state: SlotState) -> None:
        """Move a slot to ``state``; FREE returns it to the pool and wakes waiters."""
        with self._lock:
            if state not in _NEXT_STATE[slot.state]:
                raise StateError(f"slot {slot.index}: {slot.state.name} -> {state.name} is not allowed")
            slot.state = state
            if state is SlotState.FREE:
                slot.owner, slot.meta = "", None
                self._free.append(slot.index)
                self._freed.notify()
