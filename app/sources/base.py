"""What every source is, and the sink it feeds.

A :class:`FrameSource` owns one decoder thread (``detstream.decode.<id>``)
and one PyAV container. It never raises out of its thread: failures become
:class:`SourceStatus` reports (``reconnecting``/``failed``), so one bad camera
cannot stop another.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from app.ring import Slot
from app.types import FrameMeta


class SourceState(str, Enum):
    """Lifecycle states published on ``status/<id>/`` (CONTRACT.md)."""

    CONNECTING = "connecting"
    RUNNING = "running"
    RECONNECTING = "reconnecting"
    ENDED = "ended"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (SourceState.ENDED, SourceState.FAILED)


@dataclass(frozen=True)
class SourceStatus:
    """One state change of one source; ``reason`` is already free of credentials."""

    stream_id: str
    state: SourceState
    reason: str = ""
    attempt: int = 0
    retry_in_s: float | None = None
    frames: int = 0
    error_kind: str | None = None


class FrameSink(Protocol):
    """Where a source puts frames: implemented by :class:`app.batcher.Batcher`."""

    def acquire(self, stream_id: str, stop: threading.Event) -> Slot | None: ...

    def commit(self, slot: Slot, meta: FrameMeta) -> None: ...

    def abandon(self, slot: Slot) -> None: ...

    def count_drop(self, stream_id: str, frames: int = 1) -> None: ...

    def close_stream(self, stream_id: str) -> None: ...


StatusCallback = Callable[[SourceStatus], None]


class FrameSource(ABC):
    """One source: a named decoder thread feeding a :class:`FrameSink`."""

    stream_id: str

    @abstractmethod
    def start(self) -> None:
        """Start the decoder thread."""

    @abstractmethod
    def stop(self) -> None:
        """Ask the thread to stop; idempotent, returns at once."""

    @abstractmethod
    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread; True if it ended."""

    @property
    @abstractmethod
    def total_frames(self) -> int | None:
        """Frames expected (files with a known count), for progress; None when unknown."""
