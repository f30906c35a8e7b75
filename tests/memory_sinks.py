"""In-memory doubles of the publish interfaces (app/publish/base.py), passed to Pipeline through its constructor."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from app.publish.base import ResultSink
from app.types import FrameResult


class MemoryPublisher:
    """A :class:`app.publish.base.Publisher` that keeps every message, in order, per kind."""

    def __init__(self) -> None:
        self.detections: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.closed = False
        self.sent = 0
        self.dropped_hwm = 0

    def publish_detections(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        self.detections.append(dict(payload))
        self.sent += 1
        return True

    def publish_status(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        self.statuses.append(dict(payload))
        self.sent += 1
        return True

    def wait_for_subscribers(self, min_count: int = 1, timeout_s: float = 1.0) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def of(self, stream_id: str, kind: str = "detections") -> list[dict[str, Any]]:
        return [m for m in getattr(self, kind) if m["stream"] == stream_id]


class MemorySink(ResultSink):
    """A :class:`ResultSink` that keeps every frame handed to it; ``fail_after`` makes ``submit`` raise."""

    name = "memory"

    def __init__(self, fail_after: int | None = None) -> None:
        self.results: list[FrameResult] = []
        self.lossless: list[bool] = []
        self.started = threading.Event()
        self.closed = False
        self._fail_after = fail_after

    def start(self) -> None:
        self.started.set()

    def submit(self, result: FrameResult, lossless: bool) -> None:
        if self._fail_after is not None and len(self.results) >= self._fail_after:
            raise RuntimeError("injected sink failure")
        self.results.append(result)
        self.lossless.append(lossless)

    def close(self, timeout_s: float = 30.0) -> None:
        self.closed = True
