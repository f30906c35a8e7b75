"""Frames for INT8 calibration, read from a video file or an image folder, and where a build finds them.

Calibration must see what inference sees, so each frame goes through the same
letterbox as the pipeline (aspect kept, padded with grey 114, BGR→RGB, CHW,
``* scale``). Frames are spread over the whole video (every k-th) rather than
taken from its first seconds, so that the activation ranges cover its scenes.
Runs on the builder's thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from app.engines.tensorrt.runtime import BuildOptions
from app.errors import ModelError
from app.types import ModelSpec

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
PAD_VALUE = 114
CALIB_MAX_FRAMES = 512


def iter_calibration_frames(source: Path, height: int, width: int, scale: float, limit: int) -> Iterator[np.ndarray]:
    """At most ``limit`` model inputs ``(3, height, width)`` float32 from ``source``."""
    if source.is_dir():
        images = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise ModelError(f"{source}: no images ({', '.join(IMAGE_SUFFIXES)}) for calibration")
        return (letterbox_chw(image, height, width, scale) for image in _read_images(images[:limit]))
    if not source.exists():
        raise ModelError(f"{source}: calibration source does not exist")
    return (letterbox_chw(frame, height, width, scale) for frame in _read_video(source, limit))


def letterbox_chw(bgr: np.ndarray, height: int, width: int, scale: float) -> np.ndarray:
    """Fit a BGR ``(H, W, 3)`` uint8 image into ``height × width`` and return the model input."""
    import cv2

    ratio = min(height / bgr.shape[0], width / bgr.shape[1])
    new_h, new_w = max(1, round(bgr.shape[0] * ratio)), max(1, round(bgr.shape[1] * ratio))
    canvas = np.full((height, width, 3), PAD_VALUE, np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    canvas[top : top + new_h, left : left + new_w] = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(canvas[:, :, ::-1].transpose(2, 0, 1), dtype=np.float32) * np.float32(scale)


def _read_images(paths: list[Path]) -> Iterator[np.ndarray]:
    import cv2

    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise ModelError(f"{path}: not a readable image")
        yield image


def _read_video(path: Path, limit: int) -> Iterator[np.ndarray]:
    import cv2

    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise ModelError(f"{path}: cannot open video for calibration")
    try:
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) or limit
        step = max(1, total // limit)
        index = taken = 0
        while taken < limit:
            ok, frame = capture.read()
            if not ok:
                return
            if index % step == 0:
                taken += 1
                yield frame
            index += 1
    finally:
        capture.release()


def calibration_source(options: BuildOptions, spec: ModelSpec, calib: Path | None, cache_dir: Path) -> BuildOptions:
    """``options`` with calibration frames from ``calib`` (a video or image folder) and a calibration cache."""
    frames = None
    if calib is not None:
        def frames() -> Iterator[np.ndarray]:
            return iter_calibration_frames(calib, spec.input_height, spec.input_width, spec.scale, CALIB_MAX_FRAMES)
    cache = cache_dir / f"{Path(spec.path).stem}.calib"
    return dataclasses.replace(options, calib_frames=frames, calib_cache=cache)
