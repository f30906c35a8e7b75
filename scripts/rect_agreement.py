#!/usr/bin/env python
"""How much do rectangular inputs change detections, next to how much a few pixels of shift do?

The pipeline letterboxes each frame to the smallest multiple of the model's stride that holds it
(``model.rect``, e.g. 416x320 for a 4:3 camera) instead of the full 416x416 square. Same weights, less
padding, but the picture lands at another offset against the network's stride-32 grid, so detections near
the threshold change. This script puts a number on it and on its yardstick: the same square letterbox with
the picture moved down by a few pixels, which is what a camera nudged by a hand would do. Without labels,
the square input is the reference and agreement is F1 (same class, IoU >= 0.5, greedy by score).

    python scripts/rect_agreement.py [--clip vtest,bikes] [--frames 50] [--step 5]

Prints one table: F1 of rect and of square-shifted-by-N-px against square, per clip.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import av
import cv2
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench.clips import resolve_clip
from app.bench.machine import machine_info
from app.models.quantization.agreement import detect, f1_agreement
from app.models.spec import load_model_spec
from app.preprocess import PAD_VALUE, fit_input_size, letterbox_into
from app.sources.rgb import RgbConverter
from app.types import Letterbox

SHIFTS_PX = (4, 8, 16)


def square_shifted(rgb: np.ndarray, size: int, shift_px: int, scale: float) -> tuple[np.ndarray, Letterbox]:
    """The square letterbox with the picture moved ``shift_px`` rows down from the centre."""
    height, width = rgb.shape[:2]
    ratio = min(size / width, size / height)
    new_w, new_h = round(width * ratio), round(height * ratio)
    pad_x, pad_y = (size - new_w) // 2, min((size - new_h) // 2 + shift_px, size - new_h)
    tensor = np.full((3, size, size), PAD_VALUE * scale, np.float32)
    tensor[:, pad_y:pad_y + new_h, pad_x:pad_x + new_w] = cv2.resize(rgb, (new_w, new_h)).transpose(2, 0, 1) * scale
    return tensor, Letterbox(ratio, pad_x, pad_y, width, height)


def frames_of(clip: Path, count: int, step: int) -> list[np.ndarray]:
    rgb, out = RgbConverter(), []
    with av.open(str(clip)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index % step == 0:
                out.append(rgb.convert(frame).copy())
            if len(out) >= count:
                break
    return out


def compare(model: Path, clip: Path, count: int, step: int) -> dict[str, object]:
    spec = load_model_spec(model)
    if not spec.dynamic_hw:
        raise SystemExit(f"{model}: the input size is fixed, the model cannot run rectangular inputs")
    images = frames_of(clip, count, step)
    inputs: dict[str, tuple[list[np.ndarray], list[Letterbox]]] = {}
    for name, shift in [("square", 0)] + [(f"shift {s} px", s) for s in SHIFTS_PX]:
        pairs = [square_shifted(rgb, spec.input_height, shift, spec.scale) for rgb in images]
        inputs[name] = ([p[0] for p in pairs], [p[1] for p in pairs])
    rect_inputs, rect_boxes = [], []
    for rgb in images:
        height, width = fit_input_size(rgb.shape[1], rgb.shape[0], spec.input_width, spec.input_height, spec.stride,
                                       True)
        tensor = np.empty((3, height, width), np.float32)
        rect_boxes.append(letterbox_into(rgb, tensor, spec.scale))
        rect_inputs.append(tensor)
    inputs["rect"] = (rect_inputs, rect_boxes)
    found = {name: detect(model, tensors, boxes) for name, (tensors, boxes) in inputs.items()}
    reference = found.pop("square")
    return {"input": "x".join(map(str, rect_inputs[0].shape[1:])), "frames": len(images),
            "detections_per_frame": round(sum(len(d) for d in reference) / len(reference), 2),
            **{name: f1_agreement(reference, dets).f1 for name, dets in found.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", default="vtest,bikes")
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--step", type=int, default=5, help="every STEP-th frame")
    opts = parser.parse_args(argv)
    machine = machine_info()
    table = Table(title=f"F1 against the square 416x416 letterbox (fp32 {opts.model.name}; {machine['cpu']})")
    columns = ["clip", "rect input", "frames", "detections/frame", "rect", *(f"shift {s} px" for s in SHIFTS_PX)]
    for column in columns:
        table.add_column(column)
    for name in opts.clip.split(","):
        row = compare(opts.model, resolve_clip(name.strip()), opts.frames, opts.step)
        table.add_row(name, str(row["input"]), str(row["frames"]), str(row["detections_per_frame"]), str(row["rect"]),
                      *(str(row[f"shift {s} px"]) for s in SHIFTS_PX))
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
