"""Decoded PyAV frame → RGB ``(h, w, 3) uint8``, the input of the letterbox.

``frame.to_ndarray(format="rgb24")`` runs swscale's yuv→rgb at full
resolution into a freshly allocated frame, the largest share of a decoder
thread's work. For the common case, BT.601 (or untagged) limited-range
``yuv420p`` with even dimensions, the planes are read in place and OpenCV
converts them into a buffer reused for every frame, at about half the cost;
its rounding differs slightly from swscale's, which moves detections less
than a shift of the letterbox by a few pixels does. Frames tagged BT.709 or
full range ("yuvj"), other pixel formats and odd sizes keep the swscale path,
which honours those tags; OpenCV's I420 conversion would not.

Owned by one decoder thread (``detstream.decode.<id>``): the returned array is
overwritten by the next call, so a caller that keeps pixels copies them.
"""

from __future__ import annotations

import av
import cv2
import numpy as np

BT601_COLORSPACES = frozenset({2, 5, 6})
"""AVColorSpace values swscale converts with BT.601 coefficients, as OpenCV does: unspecified, BT470BG, SMPTE170M."""
LIMITED_RANGES = frozenset({0, 1})
"""AVColorRange unspecified (swscale then assumes limited) and MPEG (limited, 16–235)."""


class RgbConverter:
    """Converts frames of one source; keeps one I420 and one RGB buffer per frame size it has seen last."""

    def __init__(self) -> None:
        self._size: tuple[int, int] | None = None
        self._i420 = np.empty((0, 0), np.uint8)
        self._rgb = np.empty((0, 0, 3), np.uint8)

    def convert(self, frame: av.VideoFrame) -> np.ndarray:
        """The frame as RGB; valid until the next call."""
        if not fast_path(frame):
            return frame.to_ndarray(format="rgb24")
        width, height = frame.width, frame.height
        if self._size != (width, height):
            self._size = (width, height)
            self._i420 = np.empty((height * 3 // 2, width), np.uint8)
            self._rgb = np.empty((height, width, 3), np.uint8)
        self._gather_planes(frame, width, height)
        return cv2.cvtColor(self._i420, cv2.COLOR_YUV2RGB_I420, dst=self._rgb)

    def _gather_planes(self, frame: av.VideoFrame, width: int, height: int) -> None:
        """Copy Y, U, V (each row without the decoder's line padding) into one contiguous I420 image."""
        y, u, v = frame.planes
        luma, chroma = width * height, (width // 2) * (height // 2)
        flat = self._i420.reshape(-1)
        self._i420[:height] = _rows(y, height, width)
        flat[luma:luma + chroma].reshape(height // 2, width // 2)[:] = _rows(u, height // 2, width // 2)
        flat[luma + chroma:].reshape(height // 2, width // 2)[:] = _rows(v, height // 2, width // 2)


def fast_path(frame: av.VideoFrame) -> bool:
    """Whether OpenCV's BT.601 limited-range I420 conversion gives what swscale would for this frame."""
    return (frame.format.name == "yuv420p" and frame.width % 2 == 0 and frame.height % 2 == 0
            and frame.colorspace in BT601_COLORSPACES and frame.color_range in LIMITED_RANGES)


def _rows(plane: av.video.plane.VideoPlane, height: int, width: int) -> np.ndarray:
    """A plane's pixels as a ``(height, width)`` view of the decoder's buffer (no copy)."""
    return np.frombuffer(plane, np.uint8, count=height * plane.line_size).reshape(height, plane.line_size)[:, :width]
