"""A micro-benchmark of :func:`decode_batch` on synthetic but realistic model outputs.

    python -m lab.postprocess_bench [--layout yolov8] [--batch 8] [--candidates 2000]

It touches no model file and no engine. The synthetic batch has ``candidates_per_frame`` boxes above the
confidence threshold per frame, clustered around a few dozen objects (so NMS
has real work: many overlapping boxes per object), and the rest below it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Literal

import numpy as np

from app.postprocess.yolo import decode_batch
from app.types import Letterbox, ModelSpec

COCO_CLASSES = 80


def synthetic_outputs(
    layout: Literal["yolov5", "yolov8"],
    batch: int,
    boxes: int,
    candidates_per_frame: int,
    *,
    input_size: int = 640,
    objects: int = 40,
    seed: int = 0,
) -> np.ndarray:
    """A ``[batch, boxes, 85]`` (yolov5) or ``[batch, 84, boxes]`` (yolov8) float32 output."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(40, input_size - 40, size=(batch, objects, 2))
    sizes = rng.uniform(16, 160, size=(batch, objects, 2))
    which = rng.integers(0, objects, size=(batch, boxes))
    frame = np.arange(batch)[:, None]
    cxcy = centres[frame, which] + rng.normal(0, 4, size=(batch, boxes, 2))
    wh = sizes[frame, which] * rng.uniform(0.85, 1.15, size=(batch, boxes, 2))
    scores = rng.uniform(0, 0.2, size=(batch, boxes, COCO_CLASSES))
    hot = rng.random((batch, boxes)) < candidates_per_frame / boxes
    object_class = rng.integers(0, COCO_CLASSES, size=(batch, objects))
    scores[hot, object_class[frame, which][hot]] = rng.uniform(0.3, 1.0, size=int(hot.sum()))
    if layout == "yolov8":
        rows = np.concatenate([cxcy, wh, scores], axis=2)
        return np.ascontiguousarray(rows.transpose(0, 2, 1), dtype=np.float32)
    objectness = np.where(hot, rng.uniform(0.5, 1.0, size=(batch, boxes)), rng.uniform(0, 0.2, size=(batch, boxes)))
    scores[hot] = np.clip(scores[hot] / objectness[hot][:, None], 0, 1)
    return np.concatenate([cxcy, wh, objectness[..., None], scores], axis=2).astype(np.float32)


def bench_postprocess(
    *,
    layout: Literal["yolov5", "yolov8"] = "yolov8",
    batch: int = 8,
    boxes: int = 8400,
    candidates_per_frame: int = 2000,
    repeats: int = 20,
    seed: int = 0,
) -> dict[str, float]:
    """Time :func:`decode_batch` on one synthetic batch; milliseconds per batch.

    Returns ``{"median_ms", "p90_ms", "min_ms", "per_frame_ms", "detections_per_frame"}``.
    Defaults: a batch of 8 at 640×640 (8400 boxes, 80 classes) with 2000
    candidates per frame above ``conf_threshold=0.25``.
    """
    spec = ModelSpec(
        name="synthetic",
        path="",
        input_name="images",
        input_height=640,
        input_width=640,
        layout=layout,
        class_names=tuple(f"class{i}" for i in range(COCO_CLASSES)),
    )
    output = synthetic_outputs(layout, batch, boxes, candidates_per_frame, seed=seed)
    letterboxes = [Letterbox(scale=0.5, pad_x=0.0, pad_y=80.0, src_width=1280, src_height=960)] * batch
    timings = []
    found = 0
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        result = decode_batch(
            [output], spec, letterboxes, conf_threshold=0.25, iou_threshold=0.45, class_ids_keep=None,
            max_detections=300,
        )
        timings.append((time.perf_counter() - start) * 1000)
        found = sum(len(d) for d in result)
    ordered = np.sort(timings)
    median = float(np.median(ordered))
    return {
        "median_ms": round(median, 3),
        "p90_ms": round(float(np.percentile(ordered, 90)), 3),
        "min_ms": round(float(ordered[0]), 3),
        "per_frame_ms": round(median / batch, 3),
        "detections_per_frame": round(found / batch, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.postprocess_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["yolov5", "yolov8"], default="yolov8")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--boxes", type=int, default=8400)
    parser.add_argument("--candidates", type=int, default=2000, help="boxes above the threshold per frame")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    print(json.dumps(bench_postprocess(layout=args.layout, batch=args.batch, boxes=args.boxes,
                                       candidates_per_frame=args.candidates, repeats=args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
