"""Plane geometry for zones and lines, vectorised over a frame's boxes with NumPy.

Frame pixels, x to the right and y down. Why not ``supervision``'s
``PolygonZone``/``LineZone``: supervision is not a dependency of detstream,
and the two tests these need are a few lines each here. ``PolygonZone`` also
rasterises each polygon into a mask of the frame's size (needs the resolution
up front, one frame-sized array per zone), and ``LineZone`` keeps its own
per-track state without the debounce, dwell and lost-track exits of
:mod:`app.analytics.engine`, so that state would be written twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Point = tuple[float, float]


def anchor_points(xyxy: np.ndarray, anchor: str) -> np.ndarray:
    """``(n, 2)`` float64 anchor of each ``(n, 4)`` box: ``bottom_center``, ``center`` or ``top_center``."""
    x = (xyxy[:, 0] + xyxy[:, 2]) * 0.5
    if anchor == "bottom_center":
        y = xyxy[:, 3]
    elif anchor == "top_center":
        y = xyxy[:, 1]
    elif anchor == "center":
        y = (xyxy[:, 1] + xyxy[:, 3]) * 0.5
    else:
        raise ValueError(f"unknown anchor {anchor!r}")
    return np.stack([x, y], axis=1).astype(np.float64, copy=False)


def inside_polygon(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: each of ``points`` ``(n, 2)`` inside ``polygon`` ``(m, 2)`` (even-odd ray casting).

    A point exactly on an edge may fall either way; the debounce of the
    engine makes that harmless.
    """
    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    px, py = points[:, 0:1], points[:, 1:2]                      # (n, 1)
    x1, y1 = polygon[:, 0], polygon[:, 1]                        # (m,)
    x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
    straddles = (y1 > py) != (y2 > py)                           # (n, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x1 + (py - y1) * (x2 - x1) / (y2 - y1)
    hits = straddles & (px < x_cross)
    return (np.count_nonzero(hits, axis=1) % 2) == 1


def side_of_line(points: np.ndarray, a: Point, b: Point) -> np.ndarray:
    """``(n,)`` int8: +1 right of ``a``→``b`` as seen on screen (y down), -1 left, 0 on the line."""
    cross = (b[0] - a[0]) * (points[:, 1] - a[1]) - (b[1] - a[1]) * (points[:, 0] - a[0])
    return np.sign(cross).astype(np.int8)


def _orient(p: Point, q: Point, r: Point) -> float:
    return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])


def _on_segment(p: Point, q: Point, r: Point) -> bool:
    """``r``, collinear with ``p``-``q``, lies within their bounding box."""
    return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])


def segments_intersect(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """Segments ``p1``-``p2`` and ``q1``-``q2`` share a point (touching counts)."""
    d1, d2 = _orient(q1, q2, p1), _orient(q1, q2, p2)
    d3, d4 = _orient(p1, p2, q1), _orient(p1, p2, q2)
    if ((d1 > 0 > d2) or (d1 < 0 < d2)) and ((d3 > 0 > d4) or (d3 < 0 < d4)):
        return True
    return ((d1 == 0 and _on_segment(q1, q2, p1)) or (d2 == 0 and _on_segment(q1, q2, p2))
            or (d3 == 0 and _on_segment(p1, p2, q1)) or (d4 == 0 and _on_segment(p1, p2, q2)))


def polygon_self_intersects(points: Sequence[Sequence[float]]) -> tuple[int, int] | None:
    """The first pair of non-adjacent edges (edge ``i`` runs from point ``i`` to ``i + 1``) that touch, else None.

    Adjacent edges that fold back onto each other (a zero-area spike) count too.
    """
    pts = [(float(x), float(y)) for x, y in points]
    n = len(pts)
    edges = [(pts[i], pts[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        a1, a2 = edges[i]
        if a1 == a2:
            return (i, i)
        for j in range(i + 1, n):
            b1, b2 = edges[j]
            adjacent = j == i + 1 or (i == 0 and j == n - 1)
            if adjacent:
                shared, other_a, other_b = (a2, a1, b2) if j == i + 1 else (a1, a2, b1)
                # adjacent edges share one corner; they overlap only if collinear and pointing back
                if (_orient(shared, other_a, other_b) == 0
                        and (other_a[0] - shared[0]) * (other_b[0] - shared[0])
                        + (other_a[1] - shared[1]) * (other_b[1] - shared[1]) > 0):
                    return (i, j)
                continue
            if segments_intersect(a1, a2, b1, b2):
                return (i, j)
    return None


__all__ = ["anchor_points", "inside_polygon", "polygon_self_intersects", "segments_intersect", "side_of_line"]
