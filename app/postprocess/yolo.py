"""Decode YOLO-family outputs of a whole batch into per-frame :class:`Detections` in frame pixels.

Runs on thread ``detstream.postprocess``. Three output layouts (``ModelSpec.layout``),
all with boxes in *input* pixels (the letterboxed network input):

``yolov5``  ``[N, boxes, 5 + C]``: ``cx, cy, w, h, objectness, p(class_0) ... p(class_C-1)``.
            score = objectness × class probability of the best class (YOLOv5's default,
            one label per box); boxes with objectness ≤ ``conf_threshold`` are dropped first.
``yolov8``  ``[N, 4 + C, boxes]``: ``cx, cy, w, h, score(class_0) ...``, no objectness.
``nms``     ``[N, max_det, 6]``: ``x1, y1, x2, y2, score, class_id``, already suppressed
            by the model (padded rows have score 0); only thresholded and filtered.

Order of work: a numpy prefilter over the whole batch (a handful of vector
operations, however many frames), then class-aware NMS per frame
(:func:`app.postprocess.nms.batched_nms`), then :meth:`Letterbox.to_frame`,
which clips to the frame. Boxes narrower or lower than :data:`MIN_SIDE_PX`
after clipping are dropped: they lie outside the frame, cannot be drawn, and
would collapse to ``x1 == x2`` once rounded to 0.1 px for publishing.

The class filter (``class_ids_keep``) applies after the best class is chosen,
as YOLOv5's ``classes=`` does: a box that is mostly "car" is not relabelled
"person" because only people are wanted.

Engine output buffers are reused by the next batch; everything returned here
is a fresh array (fancy indexing copies), never a view into ``outputs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.errors import ModelError
from app.postprocess.nms import batched_nms
from app.types import Detections, Letterbox, ModelSpec

MIN_SIDE_PX = 0.5
"""Boxes whose clipped width or height in frame pixels is below this are dropped."""

MAX_NMS_CANDIDATES = 30000
"""Per frame, only this many best-scoring candidates enter NMS (YOLOv5's ``max_nms``)."""


def _expected_shape(spec: ModelSpec) -> str:
    classes = len(spec.class_names)
    return {
        "yolov5": f"[N, boxes, {5 + classes}]",
        "yolov8": f"[N, {4 + classes}, boxes]",
        "nms": "[N, max_det, 6]",
    }[spec.layout]


def check_layout(spec: ModelSpec, output_shapes: Sequence[Sequence[int | str | None]]) -> None:
    """Raise :class:`ModelError` when the first output cannot hold ``spec.layout`` for ``spec.class_names``.

    Shapes may carry symbolic or unknown dimensions (``"batch"``, ``None``,
    ``-1``), as ONNX Runtime reports dynamic axes; those are not checked.
    """
    if not output_shapes:
        raise ModelError(f"model {spec.name!r}: no outputs (expected {spec.layout} {_expected_shape(spec)})")
    shape = tuple(output_shapes[0])

    def fixed(dim: int | str | None) -> int | None:
        return dim if isinstance(dim, int) and dim >= 0 else None

    classes = len(spec.class_names)
    fits = len(shape) == 3
    if fits and spec.layout == "yolov5":
        fits = fixed(shape[2]) in (None, 5 + classes) if classes else (fixed(shape[2]) or 6) >= 6
    elif fits and spec.layout == "yolov8":
        fits = fixed(shape[1]) in (None, 4 + classes) if classes else (fixed(shape[1]) or 5) >= 5
    elif fits and spec.layout == "nms":
        fits = fixed(shape[2]) in (None, 6)
    if not fits:
        shown = "[" + ", ".join(str(dim) for dim in shape) + "]"
        raise ModelError(
            f"model {spec.name!r}: output shape {shown} does not fit layout {spec.layout} "
            f"(expected {_expected_shape(spec)} for {classes} classes)"
        )


def _candidates_yolov5(out: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    frame_idx, box_idx = np.nonzero(out[:, :, 4] > conf)
    rows = out[frame_idx, box_idx].astype(np.float32, copy=False)
    class_scores = rows[:, 5:] * rows[:, 4:5]
    class_ids = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(rows)), class_ids]
    return frame_idx, rows[:, :4], scores, class_ids


def _candidates_yolov8(out: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    frame_idx, box_idx = np.nonzero(out[:, 4:, :].max(axis=1) > conf)
    rows = out[frame_idx, :, box_idx].astype(np.float32, copy=False)
    class_ids = rows[:, 4:].argmax(axis=1)
    scores = rows[np.arange(len(rows)), 4 + class_ids]
    return frame_idx, rows[:, :4], scores, class_ids


def _cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    half = boxes[:, 2:4] / 2
    return np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1)


def _frame_detections(
    xyxy: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    letterbox: Letterbox,
    *,
    iou_threshold: float | None,
    max_detections: int,
) -> Detections:
    """NMS (unless ``iou_threshold`` is None), cap, map to frame pixels and drop degenerate boxes."""
    if iou_threshold is not None and len(scores):
        if len(scores) > MAX_NMS_CANDIDATES:
            best = np.argsort(-scores, kind="stable")[:MAX_NMS_CANDIDATES]
            xyxy, scores, class_ids = xyxy[best], scores[best], class_ids[best]
        kept = batched_nms(xyxy, scores, class_ids, iou_threshold, max_detections)
    else:
        kept = np.argsort(-scores, kind="stable")[:max_detections]
    frame_xyxy = letterbox.to_frame(xyxy[kept])
    sides = frame_xyxy[:, 2:] - frame_xyxy[:, :2]
    ok = (sides >= MIN_SIDE_PX).all(axis=1)
    return Detections(
        np.ascontiguousarray(frame_xyxy[ok], dtype=np.float32),
        scores[kept][ok].astype(np.float32),
        class_ids[kept][ok].astype(np.int32),
    )


def decode_batch(
    outputs: list[np.ndarray],
    spec: ModelSpec,
    letterboxes: Sequence[Letterbox],
    *,
    conf_threshold: float,
    iou_threshold: float,
    class_ids_keep: np.ndarray | None,
    max_detections: int,
) -> list[Detections]:
    """One :class:`Detections` per letterbox (frame), in frame pixels, best score first.

    ``outputs[0]`` holds the batch in ``spec.layout``; its leading dimension
    may exceed ``len(letterboxes)`` when the engine padded the batch (the
    padded rows are ignored). ``class_ids_keep`` keeps only those class ids
    (None keeps all). Scores must be strictly above ``conf_threshold``.
    """
    frames = len(letterboxes)
    if not outputs:
        raise ModelError(f"model {spec.name!r}: the engine returned no outputs")
    out = outputs[0]
    check_layout(spec, [out.shape])
    if out.shape[0] < frames:
        raise ModelError(f"model {spec.name!r}: output batch {out.shape[0]} is smaller than {frames} frames")
    out = out[:frames]
    if spec.layout == "yolov5":
        frame_idx, boxes, scores, class_ids = _candidates_yolov5(out, conf_threshold)
        xyxy = _cxcywh_to_xyxy(boxes)
    elif spec.layout == "yolov8":
        frame_idx, boxes, scores, class_ids = _candidates_yolov8(out, conf_threshold)
        xyxy = _cxcywh_to_xyxy(boxes)
    else:
        frame_idx, row_idx = np.nonzero(out[:, :, 4] > conf_threshold)
        rows = out[frame_idx, row_idx].astype(np.float32, copy=False)
        xyxy, scores, class_ids = rows[:, :4], rows[:, 4], np.rint(rows[:, 5]).astype(np.int64)
    keep = scores > conf_threshold
    if class_ids_keep is not None:
        keep &= np.isin(class_ids, class_ids_keep)
    frame_idx, xyxy, scores, class_ids = frame_idx[keep], xyxy[keep], scores[keep], class_ids[keep]

    bounds = np.searchsorted(frame_idx, np.arange(frames + 1))
    nms_iou = None if spec.layout == "nms" else iou_threshold
    return [
        _frame_detections(
            xyxy[start:stop],
            scores[start:stop],
            class_ids[start:stop],
            letterbox,
            iou_threshold=nms_iou,
            max_detections=max_detections,
        )
        for letterbox, start, stop in zip(letterboxes, bounds[:-1], bounds[1:], strict=True)
    ]
