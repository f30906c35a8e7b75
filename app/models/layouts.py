"""The output layouts detstream decodes, and what an output shape says about them.

===========  =======================  ===============================================
layout       output shape             rows
===========  =======================  ===============================================
``yolov5``   ``[N, boxes, 5 + C]``    cx, cy, w, h (input px), objectness, C class probs
``yolov8``   ``[N, 4 + C, boxes]``    cx, cy, w, h (input px), C class scores
``nms``      ``[N, max_det, 6]``      x1, y1, x2, y2 (input px), score, class id
===========  =======================  ===============================================

Dimensions may be symbolic (``"batch"``, ``"boxes"``) or unknown (``None``);
a shape is only ever called ambiguous, never guessed.
"""

from __future__ import annotations

from app.types import OutputLayout

Dim = int | str | None
LAYOUTS: tuple[OutputLayout, ...] = ("yolov5", "yolov8", "nms")
SHAPES = {"yolov5": "[N, boxes, 5+C]", "yolov8": "[N, 4+C, boxes]", "nms": "[N, max_det, 6]"}
MAX_NMS_DETECTIONS = 1000  # an nms output longer than this is surely a 1-class yolov5 head


def _int(dim: Dim) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def fits(layout: str, shape: list[Dim]) -> bool:
    """Whether ``shape`` can hold ``layout`` (unknown dimensions are not held against it)."""
    if len(shape) != 3:
        return False
    rows, cols = _int(shape[1]), _int(shape[2])
    # a detector proposes more boxes than it has values per box, which orients yolov5 against yolov8
    if layout == "yolov5":
        return cols is None or (cols >= 6 and (rows is None or rows >= cols))
    if layout == "yolov8":
        return rows is None or (rows >= 5 and (cols is None or cols >= rows))
    if layout == "nms":
        return cols in (None, 6)
    return False


def infer_layout(shape: list[Dim]) -> OutputLayout | None:
    """The one layout ``shape`` implies, or None when none or several could fit.

    ``[N, 300, 6]`` is nms; ``[N, 2535, 85]`` yolov5 (boxes outnumber the
    values per box); ``[N, 84, 8400]`` yolov8. With symbolic box counts the
    fixed dimension decides: ``[N, boxes, 85]`` is yolov5, ``[N, 84, boxes]``
    yolov8, ``[N, boxes, 6]`` stays ambiguous (nms or a 1-class yolov5).
    """
    if len(shape) != 3:
        return None
    rows, cols = _int(shape[1]), _int(shape[2])
    if rows is not None and cols is not None:
        if cols == 6 and rows <= MAX_NMS_DETECTIONS:
            return "nms"
        if rows > cols >= 6:
            return "yolov5"
        if cols > rows >= 5:
            return "yolov8"
        return None
    if rows is None and cols is not None and cols > 6:
        return "yolov5"
    if cols is None and rows is not None and rows >= 5:
        return "yolov8"
    return None


def class_count(layout: str, shape: list[Dim]) -> int | None:
    """C for a yolov5/yolov8 shape with a fixed value dimension; None when the shape does not say."""
    if len(shape) != 3:
        return None
    if layout == "yolov5":
        values = _int(shape[2])
        return None if values is None else values - 5
    if layout == "yolov8":
        values = _int(shape[1])
        return None if values is None else values - 4
    return None


def show(shape: list[Dim]) -> str:
    """``[batch, 2535, 85]``: a shape as people write it (unknown dims as ``?``)."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
