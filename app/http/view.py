"""What the live page shows: the latest annotated picture and the recent rates of each source.

:class:`ViewSink` is a :class:`app.publish.base.ResultSink`. On the
postprocess thread, ``submit`` only records the frame's latency and, for a
source someone watches and at most ``view_fps`` times a second, keeps a
reference to the frame (replacing one not yet drawn): it never waits. Its own
thread, ``detstream.view``, draws the boxes (:func:`app.stages.annotate.draw_detections`)
and encodes the JPEG. So an unwatched source costs a deque append per frame,
and a slow browser loses pictures, never frames.

A source is watched while a picture stream is open on it, and for
:data:`WATCH_HOLD_S` after each snapshot request (the page polls snapshots).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np

from app.publish.base import ResultSink
from app.stages.annotate import draw_detections
from app.threads import StageThread
from app.types import FrameResult

logger = logging.getLogger(__name__)

WATCH_HOLD_S = 3.0
"""A snapshot request keeps its source watched this long (longer than the page's polling interval)."""
RATE_WINDOW_S = 5.0
"""Frames per second are counted over this window."""
LATENCIES_KEPT = 256
"""Recent capture-to-publish latencies kept per source for p50/p99."""


@dataclass(frozen=True, slots=True)
class Picture:
    """One encoded picture of a source; ``number`` grows by one per picture."""

    jpeg: bytes
    seq: int
    number: int


@dataclass(frozen=True, slots=True)
class Rates:
    """A source's recent frame rate and capture-to-publish latency percentiles (0 when unknown)."""

    fps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(slots=True)
class _Stream:
    times: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCIES_KEPT))
    watchers: int = 0
    watched_until: float = 0.0
    last_taken: float = 0.0
    picture: Picture | None = None


class ViewSink(ResultSink):
    """Latest pictures and rates per source, for :mod:`app.http.api`; thread-safe."""

    name = "view"
    needs_image = True

    def __init__(self, class_names: Callable[[], tuple[str, ...]], view_fps: float = 5.0,
                 jpeg_quality: int = 75, clock: Callable[[], float] = time.monotonic) -> None:
        self._names = class_names
        self._interval_s = 1.0 / view_fps
        self._quality = jpeg_quality
        self._clock = clock
        self._streams: dict[str, _Stream] = {}
        self._pending: dict[str, FrameResult] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._drawing = 0
        self._thread = StageThread(self._run, "detstream.view")

    # -- the pipeline's side ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, result: FrameResult, lossless: bool) -> None:
        """Postprocess thread: record the frame, and keep it to draw when due; never waits for drawing."""
        meta = result.meta
        now = self._clock()
        with self._lock:
            stream = self._streams.get(meta.stream_id)
            if stream is None:
                stream = self._streams[meta.stream_id] = _Stream()
            stream.times.append(now)
            stream.latencies.append((now - meta.t_captured) * 1e3)
            if meta.image is None or not self._watched(stream, now) or \
                    now - stream.last_taken < self._interval_s - 1e-3:  # 1 ms: a 10 fps source halves exactly
                return
            stream.last_taken = now
            self._pending[meta.stream_id] = result  # a picture not drawn yet is replaced, not queued
            self._wake.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the web side (any thread) -----------------------------------------------
    def watch(self, stream_id: str) -> None:
        """A picture stream opened on ``stream_id`` (pair with :meth:`unwatch`)."""
        with self._lock:
            self._streams.setdefault(stream_id, _Stream()).watchers += 1

    def unwatch(self, stream_id: str) -> None:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream.watchers = max(0, stream.watchers - 1)

    def touch(self, stream_id: str) -> None:
        """Someone polls ``stream_id``'s snapshots: keep drawing it for :data:`WATCH_HOLD_S`."""
        with self._lock:
            self._streams.setdefault(stream_id, _Stream()).watched_until = self._clock() + WATCH_HOLD_S

    @property
    def waiting(self) -> int:
        """Pictures taken but not drawn and stored yet (at most two per source)."""
        with self._lock:
            return len(self._pending) + self._drawing

    def picture(self, stream_id: str) -> Picture | None:
        with self._lock:
            stream = self._streams.get(stream_id)
            return stream.picture if stream is not None else None

    def rates(self, stream_id: str) -> Rates:
        now = self._clock()
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                return Rates()
            times = [t for t in stream.times if now - t <= RATE_WINDOW_S]
            latencies = np.array(stream.latencies) if stream.latencies else None
        fps = 0.0
        if len(times) >= 2:
            fps = (len(times) - 1) / max(times[-1] - times[0], 1e-3)
        if latencies is None:
            return Rates(fps=fps)
        p50, p99 = np.percentile(latencies, [50, 99])
        return Rates(fps=round(fps, 2), p50_ms=round(float(p50), 1), p99_ms=round(float(p99), 1))

    def forget(self, stream_id: str) -> None:
        """A removed source: its picture and rates go."""
        with self._lock:
            self._streams.pop(stream_id, None)
            self._pending.pop(stream_id, None)

    # -- internals -----------------------------------------------------------------
    def _watched(self, stream: _Stream, now: float) -> bool:
        return stream.watchers > 0 or now < stream.watched_until

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._pending or self._closed, timeout=1.0)
                if self._closed:
                    return
                pending, self._pending = self._pending, {}
                self._drawing = len(pending)
            for stream_id, result in pending.items():
                try:
                    jpeg = self._encode(result)
                except Exception:
                    jpeg = None
                    logger.exception("view: drawing a picture of %s failed", stream_id)
                with self._lock:
                    self._drawing -= 1
                    stream = self._streams.get(stream_id)
                    if stream is not None and jpeg is not None:
                        number = stream.picture.number + 1 if stream.picture is not None else 1
                        stream.picture = Picture(jpeg, result.meta.seq, number)

    def _encode(self, result: FrameResult) -> bytes:
        canvas = draw_detections(result.meta.image, result, self._names())
        ok, data = cv2.imencode(".jpg", canvas, [cv2.IMWRITE_JPEG_QUALITY, self._quality])
        if not ok:
            raise ValueError("JPEG encoding failed")
        return data.tobytes()


__all__ = ["WATCH_HOLD_S", "Picture", "Rates", "ViewSink"]
