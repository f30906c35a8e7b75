"""From engine outputs to per-frame detections: decode, NMS, rescale to frame pixels, class filter, tracking.

:class:`Detector` knows the model and the detection settings, nothing about
publishing: the results stage hands it one batch's outputs and frame metadata
and routes the :class:`FrameResult`\\ s it returns. Runs on thread
``detstream.postprocess`` (the trackers are per stream and single-threaded),
so it adds no hand-off to the hot path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from app.config import DetstreamConfig
from app.errors import ConfigError
from app.postprocess.tracking import StreamTrackers
from app.postprocess.yolo import decode_batch
from app.types import FrameMeta, FrameResult, ModelSpec


class Detector:
    """Turns a batch's engine outputs into one :class:`FrameResult` per frame, in batch order."""

    def __init__(self, spec: ModelSpec, config: DetstreamConfig) -> None:
        model = config.model
        self.spec = spec
        self._conf = model.conf_threshold
        self._iou = model.iou_threshold
        self._max_detections = model.max_detections
        self._keep = class_filter(model.classes, spec.class_names)
        self._trackers = StreamTrackers() if config.tracking == "bytetrack" else None

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
            if self._trackers is not None:
                dets = self._trackers.update(meta.stream_id, dets)
            results.append(FrameResult(meta, dets, (t_submit - meta.t_ready) * 1e3, infer_ms, post_ms, cpu_ms))
        return results

    def forget(self, stream_id: str) -> None:
        """The stream reconnected or ended: its tracks start afresh."""
        if self._trackers is not None:
            self._trackers.reset(stream_id)


def class_filter(classes: list[str] | None, names: tuple[str, ...]) -> np.ndarray | None:
    """Class ids to keep for a ``classes:`` filter; unknown labels are a config error."""
    if not classes:
        return None
    unknown = [c for c in classes if c not in names]
    if unknown:
        raise ConfigError(f"model.classes: unknown label(s) {unknown} for this model")
    return np.array([names.index(c) for c in classes], dtype=np.int32)


__all__ = ["Detector", "class_filter"]
