"""Zone and line configs fail with pointed errors; the geometry under them is exact on the easy cases."""

from __future__ import annotations

import numpy as np
import pytest

from app.analytics.geometry import (
    anchor_points,
    inside_polygon,
    polygon_self_intersects,
    segments_intersect,
    side_of_line,
)
from app.config import parse_config
from app.errors import ConfigError

SQUARE = [[0, 0], [10, 0], [10, 10], [0, 10]]


def source(**regions) -> dict:
    return {"sources": [{"url": "cam.mp4", **regions}]}


@pytest.mark.parametrize(("regions", "message"), [
    ({"zones": [{"name": "z", "points": [[0, 0], [1, 1]]}]},
     "sources[0].zones[0].points: a zone needs at least 3 points, got 2"),
    ({"zones": [{"name": "z", "points": [[0, 0], [10, 0], [0, 10], [10, 10]]}]},
     "sources[0].zones[0].points: polygon edges 1 and 3 cross (self-intersecting)"),
    ({"zones": [{"name": "z", "points": [[0, 0], [2, 0], [0.5, 1]], "units": "normalized"}]},
     "points: [2.0, 0.0] is outside 0..1 (units: normalized)"),
    ({"lines": [{"name": "l", "points": [[5, 5], [5, 5]]}]},
     "sources[0].lines[0].points: a line of length 0 ([5.0, 5.0] twice)"),
    ({"lines": [{"name": "l", "points": [[5, 5]]}]}, "sources[0].lines[0].points: a line needs exactly 2 points"),
    ({"zones": [{"name": "a", "points": SQUARE}], "lines": [{"name": "a", "points": [[0, 0], [1, 1]]}]},
     "lines[0].name: duplicate name 'a' (also zones[0])"),
    ({"zones": [{"name": "a b", "points": SQUARE}]}, "sources[0].zones[0].name"),
    ({"lines": [{"name": "l", "points": [[0, 0], [1, 1]], "in_side": "up"}]}, "sources[0].lines[0].in_side"),
    ({"zones": [{"name": "z", "points": SQUARE, "min_dwell_s": 0}]}, "sources[0].zones[0].min_dwell_s"),
    ({"zones": [{"name": "z", "points": SQUARE, "anchor": "feet"}]}, "sources[0].zones[0].anchor"),
])
def test_a_bad_zone_or_line_is_a_config_error_naming_its_field(regions: dict, message: str):
    with pytest.raises(ConfigError) as error:
        parse_config(source(**regions))
    assert message in str(error.value)


def test_a_good_zone_and_line_load_with_their_defaults():
    config = parse_config(source(zones=[{"name": "z", "points": SQUARE}],
                                 lines=[{"name": "l", "points": [[0, 0], [1, 1]]}]))
    zone, line = config.sources[0].zones[0], config.sources[0].lines[0]
    assert (zone.anchor.value, zone.min_frames, zone.units.value, zone.min_dwell_s) == ("bottom_center", 2, "pixels",
                                                                                       None)
    assert line.in_side == "right" and line.classes is None


def test_anchor_points():
    boxes = np.array([[0, 0, 10, 20]], np.float32)
    assert anchor_points(boxes, "bottom_center").tolist() == [[5, 20]]
    assert anchor_points(boxes, "center").tolist() == [[5, 10]]
    assert anchor_points(boxes, "top_center").tolist() == [[5, 0]]


def test_inside_a_concave_polygon():
    u_shape = np.array([[0, 0], [30, 0], [30, 30], [20, 30], [20, 10], [10, 10], [10, 30], [0, 30]], float)
    points = np.array([[5, 20], [15, 20], [25, 20], [15, 5], [40, 5], [-1, 5]], float)
    assert inside_polygon(points, u_shape).tolist() == [True, False, True, True, False, False]
    assert inside_polygon(np.zeros((0, 2)), u_shape).tolist() == []


def test_sides_and_segment_intersection():
    points = np.array([[5, 1], [5, -1], [7, 0]], float)
    assert side_of_line(points, (0, 0), (10, 0)).tolist() == [1, -1, 0]  # below the line is right, on screen
    assert segments_intersect((5, -1), (5, 1), (0, 0), (10, 0))
    assert not segments_intersect((15, -1), (15, 1), (0, 0), (10, 0))  # beyond the segment's end
    assert segments_intersect((10, -1), (10, 1), (0, 0), (10, 0))  # through the end point itself


def test_self_intersection_finds_crossing_edges_and_folds_but_not_convex_or_concave_shapes():
    assert polygon_self_intersects(SQUARE) is None
    assert polygon_self_intersects([[0, 0], [10, 0], [5, 5], [10, 10], [0, 10]]) is None
    assert polygon_self_intersects([[0, 0], [10, 0], [0, 10], [10, 10]]) == (1, 3)
    assert polygon_self_intersects([[0, 0], [10, 0], [5, 0]]) is not None  # folds back on itself
