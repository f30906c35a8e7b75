"""The postprocess stage: turn each finished batch into results and route them, with source statuses, to the sinks.

Runs on thread ``detstream.postprocess``, which owns the :class:`Publisher`
(a ZeroMQ socket is not thread-safe). Per batch: wait for the engine's
outputs, give the slots back, let the :class:`Detector` decode them, then
publish each frame, count it in the :class:`DropLedger`, observe its
latencies and hand it to every :class:`ResultSink`. Source status reports
arrive on a queue and are published from here too; a terminal status
(``ended``/``failed``) is held until the batcher says the stream's last frame
has gone through, so subscribers always see it after the stream's last
detection. Every ``publish.heartbeat_s`` each stream's status is sent again.
"""

from __future__ import annotations

import logging
import queue
import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from app.analytics.engine import FrameAnalytics
from app.batcher import Batcher
from app.config import DetstreamConfig, SourceMode
from app.drops import DropLedger, DropReason, HwmWarning
from app.metrics import PipelineMetrics
from app.publish.base import Publisher, ResultSink
from app.publish.messages import detection_payload, event_payload, status_payload
from app.sources.base import SourceState, SourceStatus
from app.stages.detect import Detector
from app.stages.inference import END, Submitted
from app.stages.overload import DropReport
from app.threads import StageThread
from app.types import FrameMeta, FrameResult

logger = logging.getLogger(__name__)

RECENT_FRAMES = 512
"""Capture-to-publish latencies kept per stream for the progress line's median."""


@dataclass(frozen=True, slots=True)
class StreamSnapshot:
    """One stream as the pipeline sees it now: its source's last state and its frame counts.

    ``frames`` is the number of frames the source handed over up to the last
    published one (its last ``seq`` + 1); ``published + dropped`` reaches it
    (a detection message a subscriber missed at its HWM counts as dropped, reason ``subscriber_hwm``)
    once the stream has ended. ``p50_total_ms`` is the median capture-to-publish
    latency of its recent frames (0 before the first). ``counts``: each of its
    zones' and lines' counts by name (docs/analytics.md), empty without any.
    """

    state: SourceState
    reason: str
    attempt: int
    retry_in_s: float | None
    frames: int
    published: int
    dropped_by_reason: Mapping[DropReason, int]
    p50_total_ms: float
    counts: Mapping[str, Mapping] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())


@dataclass(slots=True)
class _Stream:
    """What the postprocess thread keeps of one stream (written on that thread only)."""

    live: bool
    state: SourceState = SourceState.CONNECTING
    reason: str = ""
    attempt: int = 0
    retry_in_s: float | None = None
    last_seq: int = -1
    total_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FRAMES))


class ResultsStage:
    """Owns thread ``detstream.postprocess`` and, through it, the publisher."""

    def __init__(self, config: DetstreamConfig, detector: Detector, engine_name: str, *, batcher: Batcher,
                 submitted: queue.Queue, statuses: queue.SimpleQueue, publisher: Publisher,
                 sinks: Sequence[ResultSink], ledger: DropLedger, metrics: PipelineMetrics) -> None:
        self._detector = detector
        self._model_name = detector.spec.name
        self._class_names = detector.spec.class_names
        self._engine_name = engine_name
        self._heartbeat_s = config.publish.heartbeat_s
        self._batcher = batcher
        self._submitted = submitted
        self._statuses = statuses
        self._publisher = publisher
        self._sinks = list(sinks)
        self._all_sinks = tuple(sinks)
        self._detached: dict[str, str] = {}  # sink name -> why its submit raised
        self._ledger = ledger
        self._metrics = metrics
        self._streams = {s.id: _Stream(s.effective_mode is SourceMode.LIVE) for s in config.sources}
        self._pending_terminal: dict[str, SourceStatus] = {}
        self._last_heartbeat = time.monotonic()
        self._last_publish_at = time.monotonic()
        self._drops = DropReport(engine_name)  # says when live cameras offer more than the engine runs
        self._hwm_warning = HwmWarning()
        self._thread = StageThread(self._run, "detstream.postprocess")

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        return self._thread.join_within(timeout_s)

    @property
    def alive(self) -> bool:
        """The postprocess thread is running."""
        return self._thread.is_alive()

    @property
    def detector(self) -> Detector:
        """The detector this stage runs (its zones and lines change through :meth:`Detector.set_regions`)."""
        return self._detector

    @property
    def last_publish_at(self) -> float:
        """``time.monotonic()`` of the last message published (detections, status or heartbeat)."""
        return self._last_publish_at

    @property
    def sink_failures(self) -> dict[str, str]:
        """Sink name -> why it stopped, for each optional sink that failed (none: empty); safe from any thread."""
        failures = {sink.name: sink.failure for sink in self._all_sinks if sink.failure}
        return {**failures, **self._detached}

    def add_stream(self, stream_id: str, live: bool) -> None:
        """Track a source added at runtime; any thread (the dict is replaced, never changed in place)."""
        self._streams = {**self._streams, stream_id: _Stream(live)}

    def remove_stream(self, stream_id: str) -> None:
        """Forget a removed source once its terminal status is out; any thread."""
        self._streams = {sid: s for sid, s in self._streams.items() if sid != stream_id}

    def streams(self) -> dict[str, StreamSnapshot]:
        """A snapshot of every stream; safe from any thread."""
        return {sid: self._snapshot(sid, stream) for sid, stream in list(self._streams.items())}

    def _snapshot(self, stream_id: str, stream: _Stream) -> StreamSnapshot:
        counts = self._ledger.counts(stream_id)
        recent = list(stream.total_ms)
        return StreamSnapshot(stream.state, stream.reason, stream.attempt, stream.retry_in_s, stream.last_seq + 1,
                              counts.published, counts.dropped_by_reason,
                              statistics.median(recent) if recent else 0.0,
                              self._detector.analytics.counts(stream_id))

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._submitted.get(timeout=0.1)
                except queue.Empty:
                    item = False
                self._drain_statuses()
                if item is END:
                    break
                if item:
                    self._handle(item)
                self._heartbeat_if_due()
                self._warn_if_overloaded()
            self._drain_statuses()
            for stream_id in list(self._pending_terminal):
                self._publish_terminal(stream_id)
        except Exception:
            logger.exception("postprocess stage crashed")
        finally:
            self._publisher.close()

    # -- batches -----------------------------------------------------------
    def _handle(self, item: Submitted) -> None:
        slots = item.batch.slots
        if slots:
            outputs = self._outputs(item)
            metas = [slot.meta for slot in slots]
            self._batcher.release(slots)  # the outputs are out of the engine: the pixels are no longer needed
            if outputs is None:
                self._fail_batch(metas, item.error)
            else:
                t_done = getattr(item.handle, "done_at", None) or time.monotonic()
                cpu_s = item.handle.cpu_s  # None unless the engine measures it (CPU workers on one thread each)
                if cpu_s is not None:
                    self._metrics.inference_cpu.inc(cpu_s)
                for result in self._detector.detect(outputs, metas, t_submit=item.t_submit, t_done=t_done,
                                                    cpu_s=cpu_s):
                    self._publish_frame(result)
        for stream_id in item.batch.ended:
            self._publish_terminal(stream_id)

    @staticmethod
    def _outputs(item: Submitted) -> list[np.ndarray] | None:
        """The batch's outputs; None (with ``item.error`` set) when the engine failed on it."""
        if item.error is not None:
            return None
        try:
            return item.handle.wait()
        except Exception as error:
            item.error = error
            return None

    def _fail_batch(self, metas: list[FrameMeta], error: Exception | None) -> None:
        """An engine error costs these frames, not the run: count them and move on."""
        self._metrics.engine_failures.inc()
        for meta in metas:
            self._ledger.drop(meta.stream_id, DropReason.ENGINE_ERROR)
        logger.warning("dropped %d frames after an engine error: %s", len(metas), error)

    def _publish_frame(self, result: FrameResult) -> None:
        meta = result.meta
        stream = self._streams[meta.stream_id]
        now = time.monotonic()
        payload = detection_payload(result, model=self._model_name, engine=self._engine_name,
                                    published_at=time.time(), dropped_before=meta.seq - stream.last_seq - 1,
                                    class_names=self._class_names, now_monotonic=now)
        delivered = self._publisher.publish_detections(meta.stream_id, payload)
        if result.analytics is not None:
            self._publish_events(meta.stream_id, result.analytics, meta.seq, meta.pts_s, meta.captured_at)
        self._last_publish_at = now
        stream.last_seq = meta.seq
        total_ms = (now - meta.t_captured) * 1e3
        stream.total_ms.append(total_ms)
        if delivered:
            policy_drops = self._ledger.publish(meta.stream_id)
        else:  # a subscriber at its HWM missed it; the next message's dropped_before says so
            policy_drops = 0
            self._ledger.drop(meta.stream_id, DropReason.SUBSCRIBER_HWM)
        self._metrics.observe_latencies(result.latencies_ms(total_ms))
        self._metrics.zmq_dropped.set(self._publisher.dropped_hwm)
        if stream.live:
            self._drops.published(meta.stream_id, policy_drops, result.infer_ms, result.cpu_ms)
        if self._sinks:
            self._to_sinks(result, lossless=not stream.live)

    def _publish_events(self, stream_id: str, analytics: FrameAnalytics | None, seq: int, pts: float | None,
                        at: float) -> None:
        """The frame's zone and line events on ``event/<stream_id>/``, counted in the metrics."""
        for event in analytics.events if analytics is not None else ():
            self._publisher.publish_event(stream_id, event_payload(stream_id, event, seq=seq, pts=pts, at=at))
            self._metrics.count_event(stream_id, event)

    def _to_sinks(self, result: FrameResult, lossless: bool) -> None:
        for sink in self._sinks:
            try:
                sink.submit(result, lossless)
            except Exception as error:
                logger.exception("sink %s failed; detaching it (detections are still published)", sink.name)
                self._detached[sink.name] = f"{type(error).__name__}: {error}"[:200]
                self._sinks = [s for s in self._sinks if s is not sink]

    # -- statuses ----------------------------------------------------------
    def _drain_statuses(self) -> None:
        while True:
            try:
                status = self._statuses.get_nowait()
            except queue.Empty:
                return
            if status.state.terminal:
                self._pending_terminal[status.stream_id] = status
            else:
                self._apply_status(status)

    def _apply_status(self, status: SourceStatus) -> None:
        stream = self._streams[status.stream_id]
        if status.state is SourceState.RECONNECTING:
            self._forget(status.stream_id)
            self._metrics.reconnects.labels(stream=status.stream_id, error_class=status.error_kind or "unknown").inc()
        stream.state, stream.reason = status.state, status.reason
        stream.attempt, stream.retry_in_s = status.attempt, status.retry_in_s
        self._metrics.set_state(status.stream_id, status.state)
        self._send_status(status.stream_id)

    def _publish_terminal(self, stream_id: str) -> None:
        status = self._pending_terminal.pop(stream_id, None)
        if status is None:
            status = SourceStatus(stream_id, SourceState.ENDED, "stopped")
        self._forget(stream_id)
        self._apply_status(status)

    def _forget(self, stream_id: str) -> None:
        """The stream's tracks start afresh; tracks inside its zones leave them (``reason: lost``)."""
        lost = self._detector.forget(stream_id)
        self._publish_events(stream_id, lost, max(self._streams[stream_id].last_seq, 0), None, time.time())

    def _send_status(self, stream_id: str) -> None:
        s = self._streams.get(stream_id)
        if s is None:  # removed at runtime after its terminal status (a heartbeat's list was older)
            return
        payload = status_payload(stream_id, s.state.value, s.reason, s.attempt, s.retry_in_s, frames=s.last_seq + 1,
                                 dropped=self._ledger.dropped(stream_id), at=time.time())
        self._publisher.publish_status(stream_id, payload)
        self._last_publish_at = time.monotonic()

    def _warn_if_overloaded(self) -> None:
        overload = self._drops.due()
        if overload:
            logger.warning(overload)
        missed = self._hwm_warning.due(self._publisher.dropped_hwm, time.monotonic())
        if missed:
            logger.warning(missed)

    def _heartbeat_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < self._heartbeat_s:
            return
        self._last_heartbeat = now
        for stream_id in self._streams:
            self._send_status(stream_id)


__all__ = ["ResultsStage", "StreamSnapshot"]
