"""Doubles passed to the pipeline through its constructor: an engine with fixed outputs, and in-memory
implementations of the publish interfaces (app/publish/base.py)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.engines.base import Engine, InferenceHandle
from app.errors import EngineError
from app.publish.base import ResultSink
from app.types import FrameResult, ModelSpec


class _Done(InferenceHandle):
    def __init__(self, outputs: list[np.ndarray]) -> None:
        self._outputs = outputs

    def wait(self) -> list[np.ndarray]:
        return self._outputs


class FixedEngine(Engine):
    """Returns one confident box per frame, fast: isolates the pipeline from model cost.

    ``fail_on_call`` (1-based) raises :class:`EngineError` on that call; ``batches`` records each call's size.
    """

    backend = "fixed:test"
    batch_sizes = (1, 2, 4)

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.spec = ModelSpec("fixed", "-", "images", 64, 64, "yolov5", ("person", "car"))
        self._out = np.zeros((4, 3, 7), np.float32)
        self._out[:, 0, :] = [32, 32, 20, 20, 0.9, 0.95, 0.01]
        self._fail_on_call = fail_on_call
        self.calls = 0
        self.batches: list[int] = []

    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        self.calls += 1
        self.batches.append(len(frames))
        if self.calls == self._fail_on_call:
            raise EngineError("injected failure")
        return _Done([self._out[: len(frames)]])


class MemoryPublisher:
    """A :class:`app.publish.base.Publisher` that keeps every message, in order, per kind."""

    def __init__(self) -> None:
        self.detections: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
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

    def publish_event(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        self.events.append(dict(payload))
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
