"""Admission and batching: between decoder threads and the engine thread.

Decoders ask for a slot (:meth:`Batcher.acquire`), fill it, and
:meth:`commit` it; the engine thread takes batches with :meth:`next_batch`.

Policies per stream (:class:`app.config.SourceMode`):

* ``file``: lossless. A stream that holds its whole quota of slots waits
  (backpressure into the decoder, so the file is simply read slower).
* ``live``: never blocks the decoder. A stream over quota gets its own oldest
  waiting frame's slot back (that frame is dropped and counted); frames older
  than ``max_staleness_s`` are dropped instead of being batched. Drops are
  recorded in the pipeline's :class:`app.drops.DropLedger` (given as ``drops``).

Fairness: each stream may hold at most ``quota`` slots (waiting, filling or in
flight), so a bursting camera cannot take the ring from the others; batches
take one frame per stream per pass, round-robin, starting after the stream
that went first last time.

Runtime streams: :meth:`Batcher.add_stream` may be called while batches
are taken (a source added to a running pipeline); :meth:`remove_stream`
forgets a stream once it has ended and its slots are back, and
:meth:`set_quota` changes every stream's share when the count changes.
With no stream left, batching waits for new ones until :meth:`finish`.

Shapes: with rectangular letterboxing, frames of cameras with different
aspect ratios have different input sizes. A batch holds one size only (the
size of its first frame); a frame of another size waits for a later batch,
which the rotation starts with another stream.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.drops import DropLedger, DropReason
from app.ring import FrameRing, Slot, SlotState
from app.types import FrameMeta


@dataclass
class _Stream:
    stream_id: str
    live: bool
    max_staleness_s: float
    ready: deque[Slot] = field(default_factory=deque)
    held: int = 0
    closed: bool = False
    end_reported: bool = False


@dataclass
class Batch:
    """Slots taken together for one engine call, plus streams whose last frame has been taken.

    ``ended`` lists streams that are closed and have nothing left waiting: the
    postprocess thread publishes their terminal status after this batch's
    results, so that `ended` always follows the stream's last detection.
    """

    slots: list[Slot]
    ended: list[str]
    t_closed: float


class Batcher:
    """Per-stream ready queues over one :class:`FrameRing`; thread-safe."""

    def __init__(self, ring: FrameRing, max_batch: int, max_wait_s: float, quota: int,
                 on_admit: Callable[[str], None] | None = None, drops: DropLedger | None = None) -> None:
        self.ring = ring
        self._on_admit = on_admit
        self._drops = drops if drops is not None else DropLedger()
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.quota = max(1, quota)
        self._streams: dict[str, _Stream] = {}
        self._order: list[str] = []
        self._next = 0
        self._finishing = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    # -- registration ------------------------------------------------------
    def add_stream(self, stream_id: str, live: bool, max_staleness_s: float = 0.5) -> None:
        """Register a stream; also while batches are taken (it joins the rotation at its end)."""
        self._drops.add_stream(stream_id)
        with self._lock:
            if stream_id in self._streams:
                raise ValueError(f"stream {stream_id!r} is registered already")
            self._streams[stream_id] = _Stream(stream_id, live, max_staleness_s)
            self._order.append(stream_id)

    def remove_stream(self, stream_id: str) -> None:
        """Forget an ended stream: closed, nothing waiting, no slot held (its last frames are through)."""
        with self._changed:
            stream = self._streams.get(stream_id)
            if stream is None:
                return
            if not stream.closed or stream.ready or stream.held:
                raise ValueError(f"stream {stream_id!r} still holds frames (closed={stream.closed}, "
                                 f"waiting={len(stream.ready)}, held={stream.held})")
            del self._streams[stream_id]
            self._order.remove(stream_id)
            self._next = self._next % max(1, len(self._order))
            self._changed.notify_all()

    def set_staleness(self, stream_id: str, max_staleness_s: float) -> None:
        """Change how old a live frame of ``stream_id`` may be when batched; applies to frames waiting now."""
        with self._lock:
            self._streams[stream_id].max_staleness_s = max_staleness_s

    def set_quota(self, quota: int) -> None:
        """Slots each stream may hold; a stream above a lowered quota just waits until it is below."""
        with self._changed:
            self.quota = max(1, quota)
            self._changed.notify_all()

    def finish(self) -> None:
        """No stream will be added any more: with none left, :meth:`next_batch` ends the run."""
        with self._changed:
            self._finishing = True
            self._changed.notify_all()

    def held(self, stream_id: str) -> int:
        """Slots ``stream_id`` holds now (filling, waiting or in flight); 0 for an unknown stream."""
        with self._lock:
            stream = self._streams.get(stream_id)
            return stream.held if stream is not None else 0

    def close_stream(self, stream_id: str) -> None:
        """No more frames will come from this stream (end of file, failure, stop)."""
        with self._changed:
            self._streams[stream_id].closed = True
            self._changed.notify_all()

    @property
    def has_live_streams(self) -> bool:
        """Whether any stream drops frames for staleness (then frames should wait here, not in the engine)."""
        return any(s.live for s in self._streams.values())

    def dropped(self, stream_id: str) -> int:
        """Frames of ``stream_id`` dropped so far, as the drop ledger counts them."""
        return self._drops.dropped(stream_id)

    def count_drop(self, stream_id: str, frames: int = 1) -> None:
        """Record live frames lost outside the ring (decoded with no slot to go to)."""
        self._drops.drop(stream_id, DropReason.LIVE_POLICY, frames)

    # -- decoder side (runs on detstream.decode.<id>) -----------------------
    def acquire(self, stream_id: str, stop: threading.Event, poll_s: float = 0.1) -> Slot | None:
        """A slot to fill for ``stream_id``; None when stopping or (live) when nothing can be reclaimed."""
        stream = self._streams[stream_id]
        with self._changed:
            while not stop.is_set():
                slot = self._take_within_quota(stream)
                if slot is not None:
                    return slot
                if stream.live:
                    return self._reclaim_oldest(stream)
                self._changed.wait(poll_s)
            return None

    def _take_within_quota(self, stream: _Stream) -> Slot | None:
        if stream.held >= self.quota:
            return None
        slot = self.ring.try_acquire(stream.stream_id)
        if slot is not None:
            stream.held += 1
        return slot

    def _reclaim_oldest(self, stream: _Stream) -> Slot | None:
        if not stream.ready:
            return None
        slot = stream.ready.popleft()
        self._drops.drop(stream.stream_id, DropReason.LIVE_POLICY)
        self.ring.transition(slot, SlotState.FILLING)
        slot.meta = None
        return slot

    def commit(self, slot: Slot, meta: FrameMeta) -> None:
        """The slot holds a letterboxed frame: queue it for batching."""
        meta.t_ready = time.monotonic()
        slot.meta = meta
        with self._changed:
            self.ring.transition(slot, SlotState.READY)
            self._streams[meta.stream_id].ready.append(slot)
            self._changed.notify_all()
        if self._on_admit is not None:
            self._on_admit(meta.stream_id)

    def abandon(self, slot: Slot) -> None:
        """Give back a slot that was not filled (decode error, stop)."""
        self.release([slot])

    # -- postprocess side -------------------------------------------------
    def release(self, slots: list[Slot]) -> None:
        """Return slots to the ring once their frames are done (or given up)."""
        with self._changed:
            for slot in slots:
                owner = self._streams.get(slot.owner)
                if owner is not None:
                    owner.held -= 1
                self.ring.transition(slot, SlotState.FREE)
            self._changed.notify_all()

    # -- engine side (runs on detstream.engine) ----------------------------
    def next_batch(self, stop: threading.Event, max_batch: int | None = None,
                   max_wait_s: float | None = None) -> Batch | None:
        """The next batch: closes when full or ``max_wait_s`` (default the batcher's) after its oldest frame.

        Returns None once every stream is closed and drained (the end of the
        run), or when ``stop`` is set and nothing is waiting.
        """
        limit = max_batch or self.max_batch
        window_s = self.max_wait_s if max_wait_s is None else max_wait_s
        taken: list[Slot] = []
        ended: list[str] = []
        deadline = None
        with self._changed:
            while True:
                self._take_round_robin(taken, limit)
                ended.extend(self._newly_ended())
                now = time.monotonic()
                if taken and deadline is None:  # the window runs from the oldest frame's arrival
                    deadline = min(slot.meta.t_ready for slot in taken) + window_s
                if len(taken) >= limit or (taken and (now >= deadline or self._all_closed())):
                    break
                if not taken and (ended or self._all_done() or stop.is_set()):
                    break
                self._changed.wait(0.05 if deadline is None else max(0.0, deadline - now))
        if not taken and not ended:
            return None
        return Batch(taken, ended, time.monotonic())

    def _take_round_robin(self, taken: list[Slot], limit: int) -> None:
        now = time.monotonic()
        progressed = True
        while len(taken) < limit and progressed:
            progressed = False
            count = len(self._order)
            for step in range(count):
                if len(taken) >= limit:
                    break
                stream = self._streams[self._order[(self._next + step) % count]]
                slot = self._pop_fresh(stream, now, taken[0].array.shape if taken else None)
                if slot is not None:
                    self.ring.transition(slot, SlotState.IN_FLIGHT)
                    taken.append(slot)
                    progressed = True
            self._next = (self._next + 1) % max(1, count)

    def _pop_fresh(self, stream: _Stream, now: float, shape: tuple[int, ...] | None) -> Slot | None:
        """The stream's oldest frame that is fresh enough and of ``shape`` (any when None); stale ones are dropped."""
        while stream.ready:
            slot = stream.ready[0]
            if stream.live and now - slot.meta.t_captured > stream.max_staleness_s:
                stream.ready.popleft()
                self._drops.drop(stream.stream_id, DropReason.LIVE_POLICY)
                stream.held -= 1
                self.ring.transition(slot, SlotState.FREE)
                continue
            if shape is not None and slot.array.shape != shape:
                return None  # another input size: it goes in a later batch
            return stream.ready.popleft()
        return None

    def _newly_ended(self) -> list[str]:
        done = []
        for stream in self._streams.values():
            if stream.closed and not stream.ready and not stream.end_reported:
                stream.end_reported = True
                done.append(stream.stream_id)
        return done

    def _all_closed(self) -> bool:
        """No more frames can arrive: waiting for the batch window would only add latency."""
        return bool(self._streams) and all(s.closed for s in self._streams.values())

    def _all_done(self) -> bool:
        if not self._streams:
            return self._finishing
        return all(s.closed and not s.ready for s in self._streams.values())

    def waiting(self) -> int:
        with self._lock:
            return sum(len(s.ready) for s in self._streams.values())
