"""Zones (translucent) and lines with their live counts, drawn on annotated frames and snapshots.

Runs on thread ``detstream.annotate`` with the :class:`FrameAnalytics` the
frame was published with, so the video shows the counts each frame had.
A line carries a small arrow from its middle towards its ``in`` side.
"""

from __future__ import annotations

import cv2
import numpy as np

from app.analytics.engine import FrameAnalytics
from app.analytics.regions import Shape

ZONE_COLOR = (0, 200, 255)     # BGR amber
LINE_COLOR = (255, 80, 255)    # BGR magenta
ZONE_ALPHA = 0.25
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def _caption(shape: Shape, counts: dict) -> str:
    if shape.kind == "zone":
        return f"{shape.name}: {counts['occupancy']} now (in {counts['in']}, out {counts['out']})"
    return f"{shape.name}: in {counts['in']}, out {counts['out']}"


def _label(canvas: np.ndarray, text: str, at: tuple[int, int], color: tuple[int, int, int]) -> None:
    (tw, th), _ = cv2.getTextSize(text, _FONT, 0.5, 1)
    height, width = canvas.shape[:2]
    x = min(max(at[0], 0), max(width - tw - 4, 0))
    y = min(max(at[1], th + 4), height - 2)
    cv2.rectangle(canvas, (x, y - th - 4), (x + tw + 4, y + 2), color, -1)
    cv2.putText(canvas, text, (x + 2, y - 2), _FONT, 0.5, (0, 0, 0), 1, cv2.LINE_AA)


def draw_analytics(canvas: np.ndarray, analytics: FrameAnalytics) -> None:
    """Draw every zone and line of ``analytics`` onto ``canvas`` (BGR, in place)."""
    zones = [s for s in analytics.shapes if s.kind == "zone" and s.points]
    if zones:
        polygons = [np.round(np.asarray(s.points)).astype(np.int32) for s in zones]
        tint = canvas.copy()
        cv2.fillPoly(tint, polygons, ZONE_COLOR)
        cv2.addWeighted(tint, ZONE_ALPHA, canvas, 1 - ZONE_ALPHA, 0, dst=canvas)
        cv2.polylines(canvas, polygons, True, ZONE_COLOR, 2, cv2.LINE_AA)
        for shape, polygon in zip(zones, polygons, strict=True):
            bottom = polygon[np.argmax(polygon[:, 1])]  # below the zone: box labels sit above boxes
            _label(canvas, _caption(shape, analytics.counts[shape.name]), (int(bottom[0]), int(bottom[1]) + 20),
                   ZONE_COLOR)
    for shape in analytics.shapes:
        if shape.kind != "line" or not shape.points:
            continue
        (x1, y1), (x2, y2) = shape.points
        a, b = (round(x1), round(y1)), (round(x2), round(y2))
        cv2.line(canvas, a, b, LINE_COLOR, 3, cv2.LINE_AA)
        length = max(float(np.hypot(x2 - x1, y2 - y1)), 1.0)
        sign = shape.in_sign or 1
        # the right-hand normal on screen (y down) of a->b is (-dy, dx)
        nx, ny = -(y2 - y1) / length * sign, (x2 - x1) / length * sign
        mid = ((x1 + x2) / 2, (y1 + y2) / 2)
        tip = (round(mid[0] + nx * 25), round(mid[1] + ny * 25))
        cv2.arrowedLine(canvas, (round(mid[0]), round(mid[1])), tip, LINE_COLOR, 2, cv2.LINE_AA, tipLength=0.35)
        _label(canvas, _caption(shape, analytics.counts[shape.name]), (min(a[0], b[0]), min(a[1], b[1]) - 6),
               LINE_COLOR)


__all__ = ["draw_analytics"]
