"""Class-aware NMS: both backends against a plain, loop-by-loop reference."""

from __future__ import annotations

import numpy as np
import pytest

from app.postprocess.nms import batched_nms, nms_numpy, nms_opencv


def reference_nms(boxes, scores, class_ids, iou_threshold, max_keep=None):
    """Textbook greedy NMS: visit boxes best-first, keep one unless a kept box of its class overlaps it too much."""

    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0

    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))  # sorted() is stable
    keep = []
    for i in order:
        if max_keep is not None and len(keep) >= max_keep:
            break
        if all(class_ids[k] != class_ids[i] or iou(boxes[k], boxes[i]) <= iou_threshold for k in keep):
            keep.append(i)
    return keep


BACKENDS = [nms_numpy, nms_opencv, batched_nms]

TABLE = [
    # (name, boxes, scores, class_ids, iou_threshold, max_keep, expected kept indices)
    ("empty", [], [], [], 0.5, None, []),
    ("one box", [[0, 0, 10, 10]], [0.9], [0], 0.5, None, [0]),
    ("overlap suppressed", [[0, 0, 10, 10], [1, 1, 11, 11]], [0.9, 0.8], [0, 0], 0.5, None, [0]),
    ("overlap of other class kept", [[0, 0, 10, 10], [1, 1, 11, 11]], [0.9, 0.8], [0, 1], 0.5, None, [0, 1]),
    ("lower score first in input", [[1, 1, 11, 11], [0, 0, 10, 10]], [0.8, 0.9], [3, 3], 0.5, None, [1]),
    ("IoU exactly at threshold kept", [[0, 0, 10, 10], [5, 0, 15, 10]], [0.9, 0.8], [0, 0], 1 / 3, None, [0, 1]),
    ("disjoint", [[0, 0, 10, 10], [20, 20, 30, 30]], [0.5, 0.6], [0, 0], 0.1, None, [1, 0]),
    ("chain: middle suppressed, far end kept",
     [[0, 0, 10, 10], [6, 0, 16, 10], [12, 0, 22, 10]], [0.9, 0.8, 0.7], [0, 0, 0], 0.2, None, [0, 2]),
    ("max_keep caps kept boxes", [[0, 0, 1, 1], [5, 5, 6, 6], [9, 9, 10, 10]], [0.1, 0.3, 0.2], [0, 0, 0], 0.5, 2,
     [1, 2]),
    ("negative coordinates stay apart per class",
     [[-50, -50, -10, -10], [-48, -50, -8, -10], [300, 300, 400, 400]], [0.9, 0.8, 0.7], [0, 1, 0], 0.5, None,
     [0, 1, 2]),
    ("equal scores keep input order", [[0, 0, 10, 10], [0, 0, 10, 10]], [0.5, 0.5], [0, 0], 0.5, None, [0]),
]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("name", "boxes", "scores", "class_ids", "iou", "max_keep", "expected"), TABLE,
                         ids=[row[0] for row in TABLE])
def test_nms_keeps_exactly_the_reference_boxes(backend, name, boxes, scores, class_ids, iou, max_keep, expected):
    xyxy = np.array(boxes, np.float32).reshape(-1, 4)
    score_arr = np.array(scores, np.float32)
    class_arr = np.array(class_ids, np.int64)
    kept = backend(xyxy, score_arr, class_arr, iou, max_keep)
    assert kept.tolist() == expected
    assert expected == reference_nms(xyxy.tolist(), score_arr, class_ids, iou, max_keep)


def random_boxes(seed: int, n: int, classes: int):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-20, 420, size=(n, 2))
    sizes = rng.uniform(4, 120, size=(n, 2))
    xyxy = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).astype(np.float32)
    scores = rng.permutation(n).astype(np.float32) / n + 0.001  # distinct, so order is unambiguous
    return xyxy, scores, rng.integers(0, classes, size=n)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("seed", "n", "classes", "iou"), [(0, 50, 1, 0.45), (1, 300, 3, 0.45), (2, 400, 80, 0.7),
                                                            (3, 200, 2, 0.1)])
def test_nms_matches_the_reference_on_random_crowds(backend, seed, n, classes, iou):
    xyxy, scores, class_ids = random_boxes(seed, n, classes)
    expected = reference_nms(xyxy.astype(np.float64).tolist(), scores, class_ids.tolist(), iou)
    assert backend(xyxy, scores, class_ids, iou).tolist() == expected
