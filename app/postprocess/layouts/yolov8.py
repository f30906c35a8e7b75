"""``yolov8``: ``[N, 4 + C, boxes]``, columns ``cx, cy, w, h, score(class_0) ... score(class_C-1)``.

Boxes are centre/size in input pixels; there is no objectness, the score
of a box is its best class score. Ultralytics YOLOv8/YOLO11 exports.
"""

from __future__ import annotations

import numpy as np

from app.postprocess.layouts.base import Candidates, Layout, Shape, cxcywh_to_xyxy, rows_and_columns


class Yolov8(Layout):
    name = "yolov8"
    shape = "[N, 4+C, boxes]"

    def fits(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        return dims is not None and (dims[0] is None or dims[0] >= 5)

    def oriented(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        if not self.fits(shape) or dims is None:
            return False
        values, boxes = dims
        return values is None or boxes is None or boxes >= values

    def implied_by(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        if dims is None or dims[0] is None or dims[0] < 5:
            return False
        values, boxes = dims
        return boxes is None or boxes > values

    def class_count(self, shape: Shape) -> int | None:
        dims = rows_and_columns(shape)
        return None if dims is None or dims[0] is None else dims[0] - 4

    def expected_shape(self, classes: int) -> str:
        return f"[N, {4 + classes}, boxes]"

    def candidates(self, out: np.ndarray, conf_threshold: float) -> Candidates:
        frame_idx, box_idx = np.nonzero(out[:, 4:, :].max(axis=1) > conf_threshold)
        rows = out[frame_idx, :, box_idx].astype(np.float32, copy=False)
        class_ids = rows[:, 4:].argmax(axis=1)
        scores = rows[np.arange(len(rows)), 4 + class_ids]
        return Candidates(frame_idx, cxcywh_to_xyxy(rows[:, :4]), scores, class_ids)


LAYOUT = Yolov8()
