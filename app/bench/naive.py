"""The naive-loop reference: the program a tutorial teaches, one frame at a time.

``cv2.VideoCapture`` → letterbox → ``session.run`` → threshold → ``cv2.dnn.NMSBoxes``
→ boxes back to frame pixels. A plain ``onnxruntime.InferenceSession`` with
default options, the same model, thresholds and clip as the pipeline. It is
written plainly on purpose: it is the baseline a user would compare with, not
something to optimise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cv2
import numpy as np
import onnxruntime as ort

from app.bench.results import Naive, Spread


def letterbox(image: np.ndarray, size: tuple[int, int], color=(114, 114, 114)):
    """Resize keeping the aspect ratio, pad to ``size`` (height, width); returns image, scale, (pad_x, pad_y)."""
    h, w = image.shape[:2]
    r = min(size[0] / h, size[1] / w)
    new_w, new_h = round(w * r), round(h * r)
    image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    pad_x, pad_y = (size[1] - new_w) // 2, (size[0] - new_h) // 2
    image = cv2.copyMakeBorder(image, pad_y, size[0] - new_h - pad_y, pad_x, size[1] - new_w - pad_x,
                               cv2.BORDER_CONSTANT, value=color)
    return image, r, (pad_x, pad_y)


def detect(session, input_name, frame, size, conf_threshold, iou_threshold):
    """One frame in, a list of (x1, y1, x2, y2, score, class_id) in frame pixels out."""
    image, r, (pad_x, pad_y) = letterbox(frame, size)
    blob = cv2.cvtColor(image, cv2.COLOR_BGR2RGB).transpose(2, 0, 1)[None].astype(np.float32) / 255.0
    pred = session.run(None, {input_name: blob})[0][0]  # [boxes, 85]: cx, cy, w, h, obj, classes...
    pred = pred[pred[:, 4] > conf_threshold]
    class_scores = pred[:, 5:] * pred[:, 4:5]
    class_ids = class_scores.argmax(axis=1)
    scores = class_scores.max(axis=1)
    keep = scores > conf_threshold
    pred, class_ids, scores = pred[keep], class_ids[keep], scores[keep]
    boxes = np.stack([pred[:, 0] - pred[:, 2] / 2, pred[:, 1] - pred[:, 3] / 2, pred[:, 2], pred[:, 3]], axis=1)
    indices = cv2.dnn.NMSBoxes(boxes.tolist(), scores.tolist(), conf_threshold, iou_threshold)
    results = []
    for i in np.array(indices).flatten():
        x, y, w, h = boxes[i]
        x1, y1 = (x - pad_x) / r, (y - pad_y) / r
        x2, y2 = (x + w - pad_x) / r, (y + h - pad_y) / r
        results.append((max(0, x1), max(0, y1), min(frame.shape[1], x2), min(frame.shape[0], y2),
                        float(scores[i]), int(class_ids[i])))
    return results


def naive_loop(clip: str, model_path: str, providers: list[str], conf_threshold: float, iou_threshold: float,
               max_frames: int | None = None, input_size: tuple[int, int] = (416, 416)) -> NaiveRun:
    """Run the tutorial loop over ``clip``; fps counts the loop only (opening the capture included).

    The input size is the model's own when its file fixes it, else ``input_size`` (height, width): a
    tutorial hardcodes the size the model was trained at (416x416 for yolov3-tiny).
    """
    session = ort.InferenceSession(model_path, providers=providers)
    model_input = session.get_inputs()[0]
    declared = model_input.shape[2:4]
    size = tuple(declared) if all(isinstance(d, int) and d > 0 for d in declared) else tuple(input_size)

    started = time.perf_counter()
    cap = cv2.VideoCapture(clip)
    frames = detections = 0
    while max_frames is None or frames < max_frames:
        ok, frame = cap.read()
        if not ok:
            break
        detections += len(detect(session, model_input.name, frame, size, conf_threshold, iou_threshold))
        frames += 1
    cap.release()
    elapsed = time.perf_counter() - started
    if frames == 0:
        raise RuntimeError(f"{clip}: cv2.VideoCapture read no frames")
    return NaiveRun(frames, frames / elapsed, detections / frames)


@dataclass(frozen=True)
class NaiveRun:
    frames: int
    fps: float
    detections_per_frame: float


def summarize_naive(clip: str, providers: list[str], runs: list[NaiveRun]) -> Naive:
    return Naive(clip=clip, providers=providers, frames=runs[-1].frames, fps=Spread.of([r.fps for r in runs]))


def naive_providers(engine: str) -> list[str]:
    """The tutorial's providers: the GPU when the pipeline's engine used one, else the CPU.

    ``engine`` is the messages' ``engine`` field, ``backend:device:precision`` (docs/messages.md): TensorRT
    always runs on the GPU; ONNX Runtime names its provider as the device; OpenVINO here runs on the CPU.
    """
    backend, _, rest = engine.partition(":")
    device = rest.partition(":")[0]
    on_gpu = backend == "tensorrt" or (backend == "onnxruntime" and device not in ("", "CPUExecutionProvider"))
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if on_gpu else ["CPUExecutionProvider"]
