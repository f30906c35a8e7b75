"""From engine outputs to per-frame detections: decode, NMS, rescale to frame pixels, class filter, tracking,
zones and lines.

:class:`Detector` knows the model and the detection settings, nothing about
publishing: the results stage hands it one batch's outputs and frame metadata
and routes the :class:`FrameResult`\\ s it returns. Runs on thread
``detstream.postprocess`` (the trackers are per stream and single-threaded),
so it adds no hand-off to the hot path. A source with zones or lines is
tracked whatever ``tracking:`` says (they count track ids), and its frames
carry their :class:`app.analytics.engine.FrameAnalytics`.

Zones and lines change while running through :meth:`Detector.set_regions`,
called from the control thread (HTTP API, reload). The analytics state is the
postprocess thread's alone, so the call only puts the change on a queue, which
that thread drains at the start of its next batch (or stream reset): a queue
rather than a swapped mapping because a change is applied against the
stream's current regions (unchanged ones keep their counts and tracks), which
only the owner may read, and because several changes must apply in the order
they were made. A stream that gains zones or lines is tracked from then on; one
that loses them all goes back to what ``tracking:`` says.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from app.analytics.config import LineConfig, ZoneConfig
from app.analytics.engine import Analytics, FrameAnalytics
from app.config import DetstreamConfig
from app.errors import ConfigError
from app.postprocess.tracking import StreamTrackers
from app.postprocess.yolo import decode_batch
from app.types import FrameMeta, FrameResult, ModelSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegionChange:
    """New zones and lines for one stream (both empty: none any more), waiting for the postprocess thread.

    ``applied`` is called there once the change is in, with the names of the stream's zones and lines that are
    gone or changed (their counts ended; :meth:`app.analytics.engine.Analytics.set_stream`).
    """

    stream_id: str
    zones: tuple[ZoneConfig, ...]
    lines: tuple[LineConfig, ...]
    applied: Callable[[list[str]], None] | None = None


class Detector:
    """Turns a batch's engine outputs into one :class:`FrameResult` per frame, in batch order."""

    def __init__(self, spec: ModelSpec, config: DetstreamConfig) -> None:
        model = config.model
        self.spec = spec
        self._conf = model.conf_threshold
        self._iou = model.iou_threshold
        self._max_detections = model.max_detections
        self._keep = class_filter(model.classes, spec.class_names)
        self.analytics = Analytics(config.sources, spec.class_names)
        self._track_all = config.tracking == "bytetrack"
        for stream_id in self.analytics.streams:
            if not self._track_all:
                logger.info("source %r has zones or lines: tracking is on for it (bytetrack)", stream_id)
        self._tracked = None if self._track_all else frozenset(self.analytics.streams)
        self._trackers = StreamTrackers() if self._track_all or self._tracked else None
        self._changes: queue.SimpleQueue[RegionChange] = queue.SimpleQueue()

    def set_regions(self, change: RegionChange) -> None:
        """Give a stream new zones and lines; any thread. Applied on the postprocess thread before its next batch
        (check the classes first: :meth:`app.analytics.engine.Analytics.check`)."""
        self._changes.put(change)

    def _apply_changes(self) -> None:
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                return
            ended = self.analytics.set_stream(change.stream_id, change.zones, change.lines)
            if not self._track_all:
                tracked = change.stream_id in self.analytics
                if tracked and change.stream_id not in self._tracked:
                    logger.info("source %r has zones or lines: tracking is on for it (bytetrack)", change.stream_id)
                    self._tracked = self._tracked | {change.stream_id}
                    if self._trackers is None:
                        self._trackers = StreamTrackers()
                elif not tracked and change.stream_id in self._tracked:
                    self._tracked = self._tracked - {change.stream_id}
                    self._trackers.reset(change.stream_id)
            if change.applied is not None:
                try:
                    change.applied(ended)
                except Exception:  # a bookkeeping failure must not end the postprocess thread
                    logger.exception("source %s: after its zones and lines changed", change.stream_id)

    def detect(self, outputs: list[np.ndarray], metas: Sequence[FrameMeta], *, t_submit: float, t_done: float,
               cpu_s: float | None = None) -> list[FrameResult]:
        """The batch's results. ``t_submit``/``t_done``: monotonic seconds when the batch went to the engine and
        its outputs were ready; ``cpu_s``: the batch's inference CPU time when the engine measures it."""
        self._apply_changes()
        t_post = time.monotonic()
        detections = decode_batch(outputs, self.spec, [m.letterbox for m in metas], conf_threshold=self._conf,
                                  iou_threshold=self._iou, class_ids_keep=self._keep,
                                  max_detections=self._max_detections)
        post_ms = (time.monotonic() - t_post) * 1e3 / len(metas)
        infer_ms = (t_done - t_submit) * 1e3
        cpu_ms = None if cpu_s is None else cpu_s * 1e3 / len(metas)
        results = []
        for meta, dets in zip(metas, detections, strict=True):
            analytics = None
            if self._trackers is not None and (self._tracked is None or meta.stream_id in self._tracked):
                dets = self._trackers.update(meta.stream_id, dets)
                if meta.stream_id in self.analytics:
                    analytics = self.analytics.update(meta, dets, self._trackers.alive(meta.stream_id))
            results.append(FrameResult(meta, dets, (t_submit - meta.t_ready) * 1e3, infer_ms, post_ms, cpu_ms,
                                       analytics))
        return results

    def forget(self, stream_id: str) -> FrameAnalytics | None:
        """The stream reconnected or ended: its tracks start afresh. Returns the exits (``reason: lost``) of the
        tracks that were inside its zones, None when it has no zones or lines."""
        self._apply_changes()
        if self._trackers is not None:
            self._trackers.reset(stream_id)
        return self.analytics.forget(stream_id)


def class_filter(classes: list[str] | None, names: tuple[str, ...]) -> np.ndarray | None:
    """Class ids to keep for a ``classes:`` filter; unknown labels are a config error."""
    if not classes:
        return None
    unknown = [c for c in classes if c not in names]
    if unknown:
        raise ConfigError(f"model.classes: unknown label(s) {unknown} for this model")
    return np.array([names.index(c) for c in classes], dtype=np.int32)


__all__ = ["Detector", "RegionChange", "class_filter"]
