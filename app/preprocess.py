"""Letterboxing a decoded frame straight into a ring slot.

Runs on the decoder thread of each source, so that the engine thread only ever
sees model-ready tensors. ``cv2.resize`` releases the GIL; for a float32
``(3, H, W)`` slot the float conversion writes into the slot in place, one
contiguous channel at a time (faster than a transposed multiply, with
identical output); a uint8 ``(H, W, 3)`` slot (:data:`app.types.UINT8_HWC`,
for an engine that scales in its graph) takes the resized pixels as they are.

Rectangular inputs. A model whose input height and width are dynamic (our
converter's yolov3-tiny, Ultralytics ``dynamic=True`` exports) does not need
the grey bars of a square letterbox: :func:`fit_input_size` pads only up to the
next multiple of the model's stride, as Ultralytics' own predictor does
(``LetterBox(auto=True)``). A 4:3 camera then runs at 416×320 instead of
416×416, a 2.35:1 clip at 416×192: compute in proportion to the area.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from app.types import FrameFormat, Letterbox

PAD_VALUE = 114  # the grey YOLO exporters pad with


def letterbox_geometry(src_width: int, src_height: int, dst_width: int, dst_height: int) -> Letterbox:
    """Scale that fits the frame inside the input, and the centring offsets (input pixels)."""
    scale = min(dst_width / src_width, dst_height / src_height)
    new_w, new_h = max(1, round(src_width * scale)), max(1, round(src_height * scale))
    return Letterbox(scale, (dst_width - new_w) // 2, (dst_height - new_h) // 2, src_width, src_height)


def fit_input_size(src_width: int, src_height: int, max_width: int, max_height: int, stride: int,
                   rect: bool) -> tuple[int, int]:
    """The model input ``(height, width)`` for a frame: the full ``max`` size, or with ``rect`` the smallest
    multiple of ``stride`` on each side that holds the frame scaled to fit ``max`` (never larger than ``max``).
    """
    if not rect:
        return max_height, max_width
    scale = min(max_width / src_width, max_height / src_height)
    new_w, new_h = max(1, round(src_width * scale)), max(1, round(src_height * scale))
    height = min(max_height, max(stride, math.ceil(new_h / stride) * stride))
    width = min(max_width, max(stride, math.ceil(new_w / stride) * stride))
    return height, width


def letterbox_into(rgb: np.ndarray, out: np.ndarray, pixel_scale: float = 1.0 / 255.0) -> Letterbox:
    """Resize ``rgb`` ``(h, w, 3) uint8`` into ``out``, padded: a ``(3, H, W) float32`` slot scaled by
    ``pixel_scale``, or a ``(H, W, 3) uint8`` one as pixels (the engine scales; :meth:`FrameFormat.of`).

    ``out`` may be any size (square or a :func:`fit_input_size` rectangle); the frame is fitted inside it
    and centred.
    """
    fmt = FrameFormat.of(out)
    src_h, src_w = rgb.shape[:2]
    dst_h, dst_w = fmt.hw(out.shape)
    box = letterbox_geometry(src_w, src_h, dst_w, dst_h)
    new_w, new_h = round(src_w * box.scale), round(src_h * box.scale)
    new_w, new_h = max(1, min(new_w, dst_w)), max(1, min(new_h, dst_h))
    same = (new_w, new_h) == (src_w, src_h)
    px, py = int(box.pad_x), int(box.pad_y)
    if fmt.channels_last:  # pixels: the picture is resized straight into the slot
        out[:py] = PAD_VALUE
        out[py + new_h:] = PAD_VALUE
        out[:, :px] = PAD_VALUE
        out[:, px + new_w:] = PAD_VALUE
        picture = out[py:py + new_h, px:px + new_w]
        if same:
            picture[...] = rgb
        else:
            cv2.resize(rgb, (new_w, new_h), dst=picture, interpolation=cv2.INTER_LINEAR)
        return box
    resized = rgb if same else cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    pad = PAD_VALUE * pixel_scale
    # Both sides always: a total padding of one pixel puts 0 on the top/left and 1 on the bottom/right.
    out[:, :py, :] = pad
    out[:, py + new_h:, :] = pad
    out[:, :, :px] = pad
    out[:, :, px + new_w:] = pad
    scale = np.float32(pixel_scale)
    for channel, plane in enumerate(cv2.split(resized)):  # contiguous planes: a fast strided-free multiply
        np.multiply(plane, scale, out=out[channel, py:py + new_h, px:px + new_w], casting="unsafe")
    return box
