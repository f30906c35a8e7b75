"""Letterboxing a decoded frame straight into a ring slot.

Runs on the decoder thread of each source, so that the engine thread only ever
sees model-ready tensors. ``cv2.resize`` releases the GIL; the float
conversion writes into the slot in place, so nothing is allocated per frame
besides the resized uint8 image.
"""

from __future__ import annotations

import cv2
import numpy as np

from app.types import Letterbox

PAD_VALUE = 114  # the grey YOLO exporters pad with


def letterbox_geometry(src_width: int, src_height: int, dst_width: int, dst_height: int) -> Letterbox:
    """Scale that fits the frame inside the input, and the centring offsets (input pixels)."""
    scale = min(dst_width / src_width, dst_height / src_height)
    new_w, new_h = max(1, round(src_width * scale)), max(1, round(src_height * scale))
    return Letterbox(scale, (dst_width - new_w) // 2, (dst_height - new_h) // 2, src_width, src_height)


def letterbox_into(rgb: np.ndarray, out: np.ndarray, pixel_scale: float = 1.0 / 255.0) -> Letterbox:
    """Resize ``rgb`` ``(h, w, 3) uint8`` into ``out`` ``(3, H, W) float32``, padded, scaled by ``pixel_scale``."""
    src_h, src_w = rgb.shape[:2]
    dst_h, dst_w = out.shape[1:]
    box = letterbox_geometry(src_w, src_h, dst_w, dst_h)
    new_w, new_h = round(src_w * box.scale), round(src_h * box.scale)
    new_w, new_h = max(1, min(new_w, dst_w)), max(1, min(new_h, dst_h))
    same = (new_w, new_h) == (src_w, src_h)
    resized = rgb if same else cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    px, py = int(box.pad_x), int(box.pad_y)
    pad = PAD_VALUE * pixel_scale
    if py:
        out[:, :py, :] = pad
        out[:, py + new_h:, :] = pad
    if px:
        out[:, :, :px] = pad
        out[:, :, px + new_w:] = pad
    np.multiply(resized.transpose(2, 0, 1), np.float32(pixel_scale), out=out[:, py:py + new_h, px:px + new_w],
                casting="unsafe")
    return box
