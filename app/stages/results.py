"""The postprocess stage: decode, NMS, rescale, track, publish, release slots.

Runs on thread ``detstream.postprocess``, which owns the ZeroMQ socket (ZMQ
sockets are not thread-safe). Source status reports arrive on a queue and are
published from here too; a terminal status (``ended``/``failed``) is held
until the batcher says the stream's last frame has gone through, so
subscribers always see it after the stream's last detection.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.batcher import Batcher
from app.config import DetstreamConfig, SourceMode
from app.metrics import PipelineMetrics
from app.postprocess.tracking import StreamTrackers
from app.postprocess.yolo import decode_batch
from app.publish.messages import detection_payload, status_payload
from app.sources.base import SourceState, SourceStatus
from app.stages.inference import END, Submitted
from app.stages.overload import DropReport
from app.threads import StageThread
from app.types import Detections, FrameResult, ModelSpec

logger = logging.getLogger(__name__)

FrameCallback = Callable[[FrameResult], None]


@dataclass
class StreamProgress:
    """What the results thread knows of one stream; read by the progress display."""

    state: str = SourceState.CONNECTING.value
    reason: str = ""
    attempt: int = 0
    retry_in_s: float | None = None
    published: int = 0
    dropped: int = 0
    last_seq: int = -1
    total_ms: list[float] = field(default_factory=list)


class ResultsStage:
    """Owns thread ``detstream.postprocess`` and, through it, the publisher."""

    def __init__(self, config: DetstreamConfig, spec: ModelSpec, engine_name: str, batcher: Batcher,
                 submitted: queue.Queue, statuses: queue.SimpleQueue, publisher, metrics: PipelineMetrics,
                 on_frame: FrameCallback | None = None) -> None:
        self._config = config
        self._spec = spec
        self._engine_name = engine_name
        self._batcher = batcher
        self._submitted = submitted
        self._statuses = statuses
        self._publisher = publisher
        self._metrics = metrics
        self._on_frame = on_frame
        self._keep = _class_filter(config.model.classes, spec.class_names)
        self._trackers = StreamTrackers() if config.tracking == "bytetrack" else None
        self.progress: dict[str, StreamProgress] = {s.id: StreamProgress() for s in config.sources}
        self._pending_terminal: dict[str, SourceStatus] = {}
        self._last_heartbeat = time.monotonic()
        self.last_publish_at = time.monotonic()
        self._live = {s.id for s in config.sources if s.effective_mode is SourceMode.LIVE}
        self._engine_dropped: Counter[str] = Counter()  # per stream, lost to engine errors since its last publish
        self._drops = DropReport(engine_name)  # says when live cameras offer more than the engine runs
        self._thread = StageThread(self._run, "detstream.postprocess")

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """The postprocess thread is running (health checks read this)."""
        return self._thread.is_alive()

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
        batch = item.batch
        if batch.slots:
            try:
                outputs = item.handle.wait() if item.error is None else None
            except Exception as error:
                outputs, item.error = None, error
            if outputs is None:
                self._fail_batch(item)
            else:
                self._publish_batch(item, outputs)
        for stream_id in batch.ended:
            self._publish_terminal(stream_id)

    def _fail_batch(self, item: Submitted) -> None:
        """An engine error costs these frames, not the run: count them and move on."""
        self._metrics.engine_failures.inc()
        for slot in item.batch.slots:
            self._batcher.count_drop(slot.owner)
            self._engine_dropped[slot.owner] += 1
            self._metrics.frames_dropped.labels(stream=slot.owner, reason="engine_error").inc()
        logger.warning("dropped %d frames after an engine error: %s", len(item.batch.slots), item.error)
        self._batcher.release(item.batch.slots)

    def _publish_batch(self, item: Submitted, outputs: list[np.ndarray]) -> None:
        t_done = getattr(item.handle, "done_at", None) or time.monotonic()
        infer_ms = (t_done - item.t_submit) * 1e3
        slots = item.batch.slots
        metas = [slot.meta for slot in slots]
        t_post = time.monotonic()
        model = self._config.model
        detections = decode_batch(outputs, self._spec, [m.letterbox for m in metas],
                                  conf_threshold=model.conf_threshold, iou_threshold=model.iou_threshold,
                                  class_ids_keep=self._keep, max_detections=model.max_detections)
        self._batcher.release(slots)  # pixels are no longer needed; metas stay alive here
        post_ms = (time.monotonic() - t_post) * 1e3 / len(metas)
        cpu_s = item.handle.cpu_s  # None unless the engine measures it (CPU workers on one thread each)
        cpu_ms = None if cpu_s is None else cpu_s * 1e3 / len(metas)
        if cpu_s is not None:
            self._metrics.inference_cpu.inc(cpu_s)
        for meta, dets in zip(metas, detections, strict=True):
            if self._trackers is not None:
                dets = self._trackers.update(meta.stream_id, dets)
            result = FrameResult(meta, dets, (item.t_submit - meta.t_ready) * 1e3, infer_ms, post_ms)
            self._publish_frame(result, cpu_ms)

    def _publish_frame(self, result: FrameResult, cpu_ms: float | None = None) -> None:
        meta = result.meta
        progress = self.progress[meta.stream_id]
        dropped_before = meta.seq - progress.last_seq - 1
        payload = detection_payload(result, model=self._spec.name, engine=self._engine_name,
                                    published_at=time.time(), dropped_before=dropped_before,
                                    class_names=self._spec.class_names)
        self._publisher.publish_detections(meta.stream_id, payload)
        self.last_publish_at = time.monotonic()
        progress.last_seq = meta.seq
        progress.published += 1
        progress.dropped += dropped_before
        total_ms = payload["latency_ms"]["total"]
        progress.total_ms.append(total_ms)
        if len(progress.total_ms) > 512:
            del progress.total_ms[:256]
        # the seq gap holds frames the live policy dropped and frames lost to an engine error (counted there)
        policy_drops = max(0, dropped_before - self._engine_dropped.pop(meta.stream_id, 0))
        self._observe(meta.stream_id, payload["latency_ms"], policy_drops)
        if meta.stream_id in self._live:
            self._drops.published(meta.stream_id, policy_drops, result.infer_ms, cpu_ms)
        if self._on_frame is not None:
            self._on_frame(result)

    def _observe(self, stream_id: str, latency_ms: dict[str, float], policy_drops: int) -> None:
        """Metrics of one published frame: its stage latencies are the message's own (same names, same values)."""
        m = self._metrics
        m.count_published(stream_id, latency_ms.items())
        if policy_drops:
            m.frames_dropped.labels(stream=stream_id, reason="live_policy").inc(policy_drops)
        m.zmq_dropped.set(self._publisher.dropped_hwm)

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
        progress = self.progress[status.stream_id]
        if status.state is SourceState.RECONNECTING:
            if self._trackers is not None:
                self._trackers.reset(status.stream_id)
            self._metrics.reconnects.labels(stream=status.stream_id, error_class=status.error_kind or "unknown").inc()
        progress.state, progress.reason = status.state.value, status.reason
        progress.attempt, progress.retry_in_s = status.attempt, status.retry_in_s
        self._metrics.set_state(status.stream_id, status.state.value)
        self._send_status(status.stream_id)

    def _publish_terminal(self, stream_id: str) -> None:
        status = self._pending_terminal.pop(stream_id, None)
        if status is None:
            status = SourceStatus(stream_id, SourceState.ENDED, "stopped")
        if self._trackers is not None:
            self._trackers.reset(stream_id)
        self._apply_status(status)

    def _send_status(self, stream_id: str) -> None:
        p = self.progress[stream_id]
        payload = status_payload(stream_id, p.state, p.reason, p.attempt, p.retry_in_s,
                                 frames=p.last_seq + 1, dropped=self._batcher.dropped(stream_id), at=time.time())
        self._publisher.publish_status(stream_id, payload)
        self.last_publish_at = time.monotonic()

    def _warn_if_overloaded(self) -> None:
        overload = self._drops.due()
        if overload:
            logger.warning(overload)

    def _heartbeat_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < self._config.publish.heartbeat_s:
            return
        self._last_heartbeat = now
        for stream_id in self.progress:
            self._send_status(stream_id)


def _class_filter(classes: list[str] | None, names: tuple[str, ...]) -> np.ndarray | None:
    """Class ids to keep for a ``classes:`` filter; unknown labels are a config error."""
    if not classes:
        return None
    from app.errors import ConfigError

    unknown = [c for c in classes if c not in names]
    if unknown:
        raise ConfigError(f"model.classes: unknown label(s) {unknown} for this model")
    return np.array([names.index(c) for c in classes], dtype=np.int32)


__all__ = ["Detections", "ResultsStage", "StreamProgress"]
