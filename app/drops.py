"""Frame accounting: the one owner of how many frames of each stream were published and dropped, and why.

Every frame a decoder hands over is either published or dropped for a named
:class:`DropReason`. :class:`DropLedger` records both, per stream, at the
moment they happen, and is the only thing that does: the status message's
``dropped``, the run summary (``RunReport``), the progress line and the
Prometheus counters ``detstream_frames_published_total`` and
``detstream_frames_dropped_total{reason}`` are all read from (or fed by) it.

A message's ``dropped_before`` is not accounting but the gap a subscriber sees
in ``seq`` (plus messages the publisher itself could not send); it is built
from sequence numbers where the message is built.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from app.metrics import PipelineMetrics


class DropReason(str, Enum):
    """Why a decoded frame was never published (the ``reason`` label of ``detstream_frames_dropped_total``)."""

    LIVE_POLICY = "live_policy"
    """A live stream gave the frame up: over its slot quota, older than ``max_staleness_ms``, or no slot free."""
    ENGINE_ERROR = "engine_error"
    """The engine failed on the frame's batch."""
    SUBSCRIBER_HWM = "subscriber_hwm"
    """A subscriber at its high-water mark missed the frame's detection message (those with room got it).

    The frame counts here rather than as published, so ``published + dropped``
    still equals the frames handed over, and the next message's ``dropped_before``
    (which carries it) never exceeds ``dropped``."""


@dataclass(frozen=True, slots=True)
class StreamCounts:
    """Published and dropped frames of one stream, as one consistent reading."""

    published: int = 0
    dropped_by_reason: Mapping[DropReason, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        """Frames dropped for any reason."""
        return sum(self.dropped_by_reason.values())


@dataclass(slots=True)
class _Stream:
    published: int = 0
    dropped: Counter[DropReason] = field(default_factory=Counter)
    policy_unreported: int = 0  # live-policy drops not yet handed to the overload report


class DropLedger:
    """Per-stream published and dropped counts, and the Prometheus counters that mirror them. Thread-safe.

    Drops are recorded on the threads that decide them (decoders, the engine
    thread's batcher, the postprocess thread); publishes on the postprocess
    thread. ``metrics`` (optional) is incremented in the same call.
    """

    def __init__(self, metrics: PipelineMetrics | None = None) -> None:
        self._metrics = metrics
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def add_stream(self, stream_id: str) -> None:
        """Start counting ``stream_id`` at zero (no-op when it is known already)."""
        with self._lock:
            self._streams.setdefault(stream_id, _Stream())

    def forget(self, stream_id: str) -> None:
        """Stop counting ``stream_id`` (a source removed at runtime); a later :meth:`add_stream` starts at zero."""
        with self._lock:
            self._streams.pop(stream_id, None)

    def drop(self, stream_id: str, reason: DropReason, frames: int = 1) -> None:
        """``frames`` frames of ``stream_id`` will never be published, for ``reason``."""
        with self._lock:
            stream = self._streams.setdefault(stream_id, _Stream())
            stream.dropped[reason] += frames
            if reason is DropReason.LIVE_POLICY:
                stream.policy_unreported += frames
        if self._metrics is not None:
            self._metrics.count_dropped(stream_id, reason.value, frames)

    def publish(self, stream_id: str) -> int:
        """One frame of ``stream_id`` published; returns the live-policy drops recorded since the previous call.

        The return value feeds the overload report (:mod:`app.stages.overload`), which
        wants drops per published frame; the totals are not affected by reading it.
        """
        with self._lock:
            stream = self._streams.setdefault(stream_id, _Stream())
            stream.published += 1
            unreported, stream.policy_unreported = stream.policy_unreported, 0
        if self._metrics is not None:
            self._metrics.count_published(stream_id)
        return unreported

    def counts(self, stream_id: str) -> StreamCounts:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                return StreamCounts()
            return StreamCounts(stream.published, MappingProxyType(dict(stream.dropped)))

    def dropped(self, stream_id: str) -> int:
        """Frames of ``stream_id`` dropped for any reason so far."""
        with self._lock:
            stream = self._streams.get(stream_id)
            return sum(stream.dropped.values()) if stream is not None else 0


class HwmWarning:
    """Says, at most once per ``every_s`` while it goes on, that subscribers miss messages at their high-water mark.

    Fed the publisher's running total (``Publisher.dropped_hwm``, detection and
    status messages); :meth:`due` returns the WARNING text when one is due, else None.
    """

    def __init__(self, every_s: float = 60.0) -> None:
        self._every_s = every_s
        self._reported = 0
        self._reported_at: float | None = None

    def due(self, total: int, now: float) -> str | None:
        new = total - self._reported
        if new <= 0 or (self._reported_at is not None and now - self._reported_at < self._every_s):
            return None
        since = "" if self._reported_at is None else f" in the last {now - self._reported_at:.0f} s"
        self._reported, self._reported_at = total, now
        return (f"a subscriber at its high-water mark missed {new} messages{since} ({total} in all); the others "
                "still receive every message. A subscriber reads slower than detstream publishes "
                "(see publish.sndhwm and the subscriber's rcvhwm)")


__all__ = ["DropLedger", "DropReason", "HwmWarning", "StreamCounts"]
