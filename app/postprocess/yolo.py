"""Decode a whole batch of model outputs into per-frame :class:`Detections` in frame pixels.

Runs on thread ``detstream.postprocess``. How an output is laid out and read
into candidate boxes is the job of its layout (``ModelSpec.layout``, looked up
in :data:`app.postprocess.layouts.LAYOUTS`: ``yolov5``, ``yolov8``, ``nms``);
everything after that is the same for every layout and lives here.

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
from app.postprocess.layouts import LAYOUTS, known
from app.postprocess.layouts.base import Layout
from app.postprocess.nms import batched_nms
from app.types import Detections, Letterbox, ModelSpec

MIN_SIDE_PX = 0.5
"""Boxes whose clipped width or height in frame pixels is below this are dropped."""

MAX_NMS_CANDIDATES = 30000
"""Per frame, only this many best-scoring candidates enter NMS (YOLOv5's ``max_nms``)."""


def _layout_of(spec: ModelSpec) -> Layout:
    layout = LAYOUTS.get(spec.layout)
    if layout is None:
        raise ModelError(f"model {spec.name!r}: layout {spec.layout!r} is not a known layout ({known()})")
    return layout


def check_layout(spec: ModelSpec, output_shapes: Sequence[Sequence[int | str | None]]) -> Layout:
    """The layout of ``spec``; :class:`ModelError` when the first output cannot hold it for ``spec.class_names``.

    Shapes may carry symbolic or unknown dimensions (``"batch"``, ``None``,
    ``-1``), as ONNX Runtime reports dynamic axes; those are not checked.
    """
    layout = _layout_of(spec)
    classes = len(spec.class_names)
    if not output_shapes:
        raise ModelError(f"model {spec.name!r}: no outputs (expected {spec.layout} {layout.expected_shape(classes)})")
    shape = tuple(output_shapes[0])
    if not layout.fits(shape) or (classes and layout.class_count(shape) not in (None, classes)):
        shown = "[" + ", ".join(str(dim) for dim in shape) + "]"
        raise ModelError(
            f"model {spec.name!r}: output shape {shown} does not fit layout {spec.layout} "
            f"(expected {layout.expected_shape(classes)} for {classes} classes)"
        )
    return layout


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
    layout = check_layout(spec, [out.shape])
    if out.shape[0] < frames:
        raise ModelError(f"model {spec.name!r}: output batch {out.shape[0]} is smaller than {frames} frames")
    out = out[:frames]
    frame_idx, xyxy, scores, class_ids = layout.candidates(out, conf_threshold)
    keep = scores > conf_threshold
    if class_ids_keep is not None:
        keep &= np.isin(class_ids, class_ids_keep)
    frame_idx, xyxy, scores, class_ids = frame_idx[keep], xyxy[keep], scores[keep], class_ids[keep]

    bounds = np.searchsorted(frame_idx, np.arange(frames + 1))
    nms_iou = None if layout.suppressed else iou_threshold
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
