"""The overlay tints zones, draws lines and their counts, and leaves the rest of the frame alone."""

from __future__ import annotations

import numpy as np

from app.analytics.engine import FrameAnalytics
from app.analytics.overlay import LINE_COLOR, ZONE_ALPHA, ZONE_COLOR, draw_analytics
from app.analytics.regions import Shape

ZONE = Shape("yard", "zone", ((100.0, 100.0), (300.0, 100.0), (300.0, 300.0), (100.0, 300.0)))
LINE = Shape("gate", "line", ((400.0, 50.0), (400.0, 400.0)), -1)
COUNTS = {"yard": {"in": 3, "out": 1, "occupancy": 2, "labels": {}}, "gate": {"in": 5, "out": 4, "labels": {}}}


def test_zones_are_translucent_lines_are_drawn_and_far_pixels_are_untouched():
    canvas = np.full((480, 640, 3), 100, np.uint8)
    draw_analytics(canvas, FrameAnalytics((), (ZONE, LINE), COUNTS))
    tinted = np.round(np.array(ZONE_COLOR) * ZONE_ALPHA + 100 * (1 - ZONE_ALPHA))
    assert np.abs(canvas[200, 200].astype(int) - tinted).max() <= 1  # inside the zone, away from edges and text
    assert canvas[200, 400].tolist() == list(LINE_COLOR)
    assert canvas[470, 600].tolist() == [100, 100, 100]
    assert (canvas[300:330, 100:300] != 100).any()  # the zone's caption sits below its bottom edge


def test_a_frame_without_shapes_is_left_as_it_is():
    canvas = np.full((48, 64, 3), 7, np.uint8)
    draw_analytics(canvas, FrameAnalytics((), (), {}))
    assert (canvas == 7).all()
