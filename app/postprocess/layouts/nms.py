"""``nms``: ``[N, max_det, 6]``, rows ``x1, y1, x2, y2, score, class_id``, already suppressed by the model.

Boxes are corners in input pixels; padded rows have score 0. The decode
only thresholds, filters and caps (end-to-end exports with in-graph NMS).
"""

from __future__ import annotations

import numpy as np

from app.postprocess.layouts.base import Candidates, Layout, Shape, rows_and_columns

MAX_DETECTIONS = 1000
"""An output with more rows than this is not called nms from its shape alone (it reads as a 1-class yolov5 head)."""


class Nms(Layout):
    name = "nms"
    shape = "[N, max_det, 6]"
    suppressed = True

    def fits(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        return dims is not None and dims[1] in (None, 6)

    def implied_by(self, shape: Shape) -> bool:
        dims = rows_and_columns(shape)
        return dims is not None and dims[1] == 6 and (dims[0] is None or dims[0] <= MAX_DETECTIONS)

    def candidates(self, out: np.ndarray, conf_threshold: float) -> Candidates:
        frame_idx, row_idx = np.nonzero(out[:, :, 4] > conf_threshold)
        rows = out[frame_idx, row_idx].astype(np.float32, copy=False)
        return Candidates(frame_idx, rows[:, :4], rows[:, 4], np.rint(rows[:, 5]).astype(np.int64))


LAYOUT = Nms()
