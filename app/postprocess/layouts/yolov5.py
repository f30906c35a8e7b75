"""``yolov5``: ``[N, boxes, 5 + C]``, rows ``cx, cy, w, h, objectness, p(class_0) ... p(class_C-1)``.

Boxes are centre/size in input pixels. The score of a box is objectness ×
the probability of its best class (YOLOv5's default, one label per box);
boxes whose objectness is not above the threshold are dropped first. The
Darknet converter writes this layout, as do YOLOv5 and YOLOv7 exports.
"""

from __future__ import annotations

import numpy as np

from app.postprocess.layouts.base import Candidates, Layout, Shape, cxcywh_to_xyxy, rows_and_columns

ONE_CLASS_MIN_BOXES = 1000
"""A 6-value row is one class; such an output is called yolov5 only above this many boxes (fewer reads as
an in-graph NMS output, whose rows are 6 values too)."""


class Yolov5(Layout):
    name = "yolov5"
    shape = "[N, boxes, 5+C]"

    def fits(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        return dims is not None and (dims[1] is None or dims[1] >= 6)

    def oriented(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        if not self.fits(shape) or dims is None:
            return False
        rows, columns = dims
        return rows is None or columns is None or rows >= columns

    def implied_by(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        if dims is None or dims[1] is None or dims[1] < 6:
            return False
        rows, columns = dims
        return rows is None or (rows > columns and (columns > 6 or rows > ONE_CLASS_MIN_BOXES))

    def class_count(self, shape: Shape) -> int | None:
        dims = rows_and_columns(shape)
        return None if dims is None or dims[1] is None else dims[1] - 5

    def expected_shape(self, classes: int) -> str:
        return f"[N, boxes, {5 + classes}]"

    def candidates(self, out: np.ndarray, conf_threshold: float) -> Candidates:
        frame_idx, box_idx = np.nonzero(out[:, :, 4] > conf_threshold)
        rows = out[frame_idx, box_idx].astype(np.float32, copy=False)
        class_scores = rows[:, 5:] * rows[:, 4:5]
        class_ids = class_scores.argmax(axis=1)
        scores = class_scores[np.arange(len(rows)), class_ids]
        return Candidates(frame_idx, cxcywh_to_xyxy(rows[:, :4]), scores, class_ids)


LAYOUT = Yolov5()
