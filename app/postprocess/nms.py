"""Class-aware non-maximum suppression on ``(n, 4)`` xyxy boxes.

Boxes of different classes never suppress each other. A box is suppressed
when its IoU with a higher-scoring kept box of the same class is strictly
greater than ``iou_threshold`` (torchvision and OpenCV agree on this). Equal
scores keep their input order (stable sort), so results are deterministic.

:func:`batched_nms` uses OpenCV's ``cv2.dnn.NMSBoxesBatched`` (C++, the fast
path) when the installed OpenCV has it, else :func:`nms_numpy`. Both return
the same indices; the unit tests hold them to a plain reference.
"""

from __future__ import annotations

import cv2
import numpy as np

HAVE_OPENCV_BATCHED_NMS = hasattr(cv2, "dnn") and hasattr(cv2.dnn, "NMSBoxesBatched")


def _empty_indices() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _shift_by_class(xyxy: np.ndarray, class_ids: np.ndarray) -> np.ndarray:
    """Boxes moved to non-negative coordinates and apart per class, so one NMS pass is class-aware."""
    boxes = xyxy.astype(np.float64) - float(xyxy.min())
    span = float(boxes.max()) + 1.0
    return boxes + (class_ids.astype(np.float64) * span)[:, None]


def iou_one_to_many(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one xyxy ``box`` with each row of ``boxes``; 0 where the union is empty."""
    width = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = width * height
    area = max(box[2] - box[0], 0) * max(box[3] - box[1], 0)
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    union = area + areas - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms_numpy(
    xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float, max_keep: int | None = None
) -> np.ndarray:
    """Greedy class-aware NMS in numpy; indices of kept boxes, best score first.

    One vectorised IoU row per *kept* box, so the Python loop runs at most
    ``max_keep`` times however many candidates there are.
    """
    if len(scores) == 0:
        return _empty_indices()
    boxes = _shift_by_class(xyxy, class_ids)
    remaining = np.argsort(-scores.astype(np.float64), kind="stable")
    keep: list[int] = []
    limit = len(scores) if max_keep is None else max_keep
    while remaining.size and len(keep) < limit:
        best = int(remaining[0])
        keep.append(best)
        rest = remaining[1:]
        remaining = rest[iou_one_to_many(boxes[best], boxes[rest]) <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def nms_opencv(
    xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float, max_keep: int | None = None
) -> np.ndarray:
    """Class-aware NMS with ``cv2.dnn.NMSBoxesBatched``; indices of kept boxes, best score first.

    OpenCV offsets classes by the largest coordinate, which is wrong for
    negative coordinates (boxes poking out of the input), so boxes are moved
    to non-negative coordinates first. OpenCV's ``top_k`` caps candidates
    *before* suppression, so the cap on kept boxes is applied afterwards.
    """
    if len(scores) == 0:
        return _empty_indices()
    boxes = xyxy.astype(np.float64) - float(xyxy.min())
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    kept = cv2.dnn.NMSBoxesBatched(
        xywh, scores.astype(np.float32), class_ids.astype(np.int32), float(np.finfo(np.float32).min), iou_threshold
    )
    indices = np.asarray(kept, dtype=np.int64).reshape(-1)
    return indices if max_keep is None else indices[:max_keep]


def batched_nms(
    xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float, max_keep: int | None = None
) -> np.ndarray:
    """Class-aware NMS with the fastest backend available; indices of kept boxes, best score first."""
    if HAVE_OPENCV_BATCHED_NMS:
        return nms_opencv(xyxy, scores, class_ids, iou_threshold, max_keep)
    return nms_numpy(xyxy, scores, class_ids, iou_threshold, max_keep)
