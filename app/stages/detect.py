"""From engine outputs to per-frame detections: decode, NMS, rescale to frame pixels, class filter, tracking,
zones and lines.

:class:`Detector` knows the model and the detection settings, nothing about
publishing: the results stage hands it one batch's outputs and frame metadata
and routes the :class:`FrameResult`\\ s it returns. Runs on thread
``detstream.postprocess`` (the trackers are per stream and single-threaded),
so it adds no hand-off to the hot path. A source with zones or lines is
tracked whatever ``tracking:`` says (they count track ids), and its frames
carry their :class:`app.analytics.engine.FrameAnalytics`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from app.analytics.engine import Analytics, FrameAnalytics
from app.config import DetstreamConfig
from app.errors import ConfigError
from app.postprocess.tracking import StreamTrackers
from app.postprocess.yolo import decode_batch
from app.types import FrameMeta, FrameResult, ModelSpec

logger = logging.getLogger(__name__)


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
        for stream_id in self.analytics.streams:
            if config.tracking != "bytetrack":
                logger.info("source %r has zones or lines: tracking is on for it (bytetrack)", stream_id)
        self._tracked = None if config.tracking == "bytetrack" else frozenset(self.analytics.streams)
        self._trackers = StreamTrackers() if config.tracking == "bytetrack" or self._tracked else None

    def detect(self, outputs: list[np.ndarray], metas: Sequence[FrameMeta], *, t_submit: float, t_done: float,
               cpu_s: float | None = None) -> list[FrameResult]:
        """The batch's results. ``t_submit``/``t_done``: monotonic seconds when the batch went to the engine and
        its outputs were ready; ``cpu_s``: the batch's inference CPU time when the engine measures it."""
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


__all__ = ["Detector", "class_filter"]
