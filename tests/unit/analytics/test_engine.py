"""Zones and lines on synthetic track sequences: each test walks tracks along known paths, frame by frame."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pytest

from app.analytics.engine import Analytics, Event
from app.config import parse_config
from app.errors import ConfigError
from app.types import Detections, FrameMeta, Letterbox

NAMES = ("person", "car", "dog")
W, H = 640, 480
LINE = {"name": "gate", "points": [[200, 400], [200, 100]], "in_side": "right", "min_frames": 2}
ZONE = {"name": "yard", "points": [[300, 100], [500, 100], [500, 400], [300, 400]], "min_dwell_s": 3.0}


def build(zones: Sequence[dict] = (), lines: Sequence[dict] = ()) -> Analytics:
    config = parse_config({"sources": [{"url": "cam.mp4", "id": "cam", "zones": list(zones), "lines": list(lines)}]})
    return Analytics(config.sources, NAMES)


def box(x: float, y: float, w: float = 40, h: float = 100) -> list[float]:
    """A box whose bottom centre (the default anchor) is at (x, y)."""
    return [x - w / 2, y - h, x + w / 2, y]


class Clip:
    """Feeds frames of ``(track_id, x, y[, label])`` to an :class:`Analytics`, 10 frames per second."""

    def __init__(self, analytics: Analytics, fps: float = 10.0) -> None:
        self.analytics = analytics
        self.fps = fps
        self.seq = 0
        self.events: list[Event] = []
        self.alive: set[int] = set()

    def frame(self, tracks: Iterable[tuple], alive: Iterable[int] | None = None) -> list[Event]:
        rows = list(tracks)
        xyxy = np.array([box(t[1], t[2]) for t in rows], np.float32).reshape(-1, 4)
        labels = [NAMES.index(t[3]) if len(t) > 3 else 0 for t in rows]
        dets = Detections(xyxy, np.full(len(rows), 0.9, np.float32), np.array(labels, np.int32),
                          np.array([t[0] for t in rows], np.int64))
        self.alive |= {t[0] for t in rows}
        if alive is not None:
            self.alive = set(alive)
        meta = FrameMeta("cam", self.seq, self.seq / self.fps, 1e9 + self.seq, 0.0, 1.0, Letterbox(1, 0, 0, W, H))
        self.seq += 1
        result = self.analytics.update(meta, dets, self.alive)
        self.events += result.events
        return list(result.events)

    def walk(self, track_id: int, xs: Iterable[float], y: float = 250, label: str = "person") -> None:
        for x in xs:
            self.frame([(track_id, x, y, label)])

    def kinds(self) -> list[tuple]:
        return [(e.kind, e.region, e.track_id, e.direction or e.reason) for e in self.events]


def counts(analytics: Analytics, name: str) -> dict:
    return analytics.counts("cam")[name]


def test_a_track_crossing_once_counts_one_in_with_its_box_and_counts():
    clip = Clip(build(lines=[LINE]))
    clip.walk(1, range(150, 260, 10))
    assert clip.kinds() == [("cross", "gate", 1, "in")]
    event = clip.events[0]
    assert event.label == "person" and event.score == pytest.approx(0.9)
    assert event.box == (200.0, 150.0, 240.0, 250.0)  # x 200 is on the line; x 210, 220 confirmed the side
    assert event.counts == {"in": 1, "out": 0, "labels": {"person": {"in": 1, "out": 0}}}


def test_crossing_and_coming_back_counts_one_in_and_one_out():
    clip = Clip(build(lines=[LINE]))
    clip.walk(1, [*range(150, 260, 10), *range(250, 140, -10)])
    assert clip.kinds() == [("cross", "gate", 1, "in"), ("cross", "gate", 1, "out")]
    assert counts(clip.analytics, "gate")["in"] == 1 and counts(clip.analytics, "gate")["out"] == 1


def test_a_track_jittering_on_the_line_counts_once():
    clip = Clip(build(lines=[LINE]))
    clip.walk(1, [180, 190, 198, 203, 197, 204, 196, 202, 198, 205, 210, 220, 230])
    assert clip.kinds() == [("cross", "gate", 1, "in")]


def test_jitter_alone_never_counts_and_a_longer_min_frames_waits_longer():
    clip = Clip(build(lines=[{**LINE, "min_frames": 3}]))
    clip.walk(1, [190, 210, 212, 190, 210, 211, 190, 210, 211])  # never three frames on the right
    assert clip.kinds() == []
    clip.walk(1, [210, 211, 212])
    assert clip.kinds() == [("cross", "gate", 1, "in")]


def test_moving_along_the_line_counts_nothing():
    clip = Clip(build(lines=[LINE]))
    clip.frame([(1, 190, 50)])
    for y in range(100, 420, 20):  # exactly on the line, then down along it
        clip.frame([(1, 200, y)])
    assert clip.kinds() == []


def test_passing_beyond_the_segments_end_is_no_crossing_and_coming_back_through_it_is():
    clip = Clip(build(lines=[LINE]))
    clip.walk(1, range(150, 260, 10), y=450)  # below the segment's lower end (y 400)
    assert clip.kinds() == []
    clip.frame([(1, 250, 300)])
    clip.walk(1, range(240, 140, -10), y=300)
    assert clip.kinds() == [("cross", "gate", 1, "out")]


def test_in_side_left_reverses_the_direction():
    clip = Clip(build(lines=[{**LINE, "in_side": "left"}]))
    clip.walk(1, range(150, 260, 10))
    assert clip.kinds() == [("cross", "gate", 1, "out")]


def test_entering_a_zone_dwelling_and_leaving_with_occupancy():
    clip = Clip(build(zones=[ZONE]))
    clip.walk(7, range(250, 360, 10))
    assert clip.kinds() == [("enter", "yard", 7, None)]
    assert counts(clip.analytics, "yard")["occupancy"] == 1
    clip.walk(7, [360] * 5)
    clip.walk(7, range(360, 560, 20))
    assert clip.kinds() == [("enter", "yard", 7, None), ("exit", "yard", 7, None)]
    assert counts(clip.analytics, "yard") == {"in": 1, "out": 1, "occupancy": 0,
                                              "labels": {"person": {"in": 1, "out": 1, "occupancy": 0}}}


@pytest.mark.parametrize(("frames_inside", "dwells"), [(30, 0), (31, 1), (80, 1)])
def test_dwell_fires_once_at_the_threshold_and_not_just_under(frames_inside: int, dwells: int):
    """At 10 fps the first frame inside is t0; the dwell is due on the frame at t0 + 3.0 s, the 31st."""
    clip = Clip(build(zones=[ZONE]))
    clip.frame([(1, 250, 250)])
    clip.walk(1, [400] * frames_inside)
    assert [e.kind for e in clip.events] == ["enter"] + ["dwell"] * dwells


def test_a_track_vanishing_inside_a_zone_exits_as_lost_when_the_tracker_drops_it():
    clip = Clip(build(zones=[ZONE]))
    clip.walk(3, [250, 400, 400, 400])
    clip.frame([], alive={3})        # not detected, the tracker still holds it: still inside
    assert counts(clip.analytics, "yard")["occupancy"] == 1
    clip.frame([], alive=set())      # dropped by the tracker
    assert clip.kinds() == [("enter", "yard", 3, None), ("exit", "yard", 3, "lost")]
    assert clip.events[-1].box is None and clip.events[-1].counts["occupancy"] == 0


def test_forgetting_a_stream_exits_every_track_inside_and_keeps_the_counts():
    analytics = build(zones=[ZONE], lines=[LINE])
    clip = Clip(analytics)
    clip.frame([(1, 250, 250), (2, 100, 250)])
    clip.frame([(1, 400, 250), (2, 100, 250)])
    clip.frame([(1, 400, 250), (2, 100, 250)])
    lost = analytics.forget("cam")
    assert [(e.kind, e.track_id, e.reason) for e in lost.events] == [("exit", 1, "lost")]
    assert counts(analytics, "yard")["in"] == 1 and counts(analytics, "yard")["occupancy"] == 0


def test_two_classes_are_counted_apart_and_a_class_filter_ignores_the_others():
    clip = Clip(build(zones=[ZONE, {**ZONE, "name": "cars_only", "classes": ["car"]}]))
    for x in range(250, 360, 10):
        clip.frame([(1, x, 200, "person"), (2, x, 300, "car")])
    yard = counts(clip.analytics, "yard")
    assert yard["occupancy"] == 2
    assert yard["labels"] == {"person": {"in": 1, "out": 0, "occupancy": 1}, "car": {"in": 1, "out": 0, "occupancy": 1}}
    assert counts(clip.analytics, "cars_only")["labels"] == {"car": {"in": 1, "out": 0, "occupancy": 1}}


def test_the_frame_analytics_message_field_has_zone_occupancy_per_class_and_line_totals():
    clip = Clip(build(zones=[ZONE], lines=[LINE]))
    for x in range(150, 360, 10):
        clip.frame([(1, x, 250, "car")])
    meta = FrameMeta("cam", 99, 9.9, 1e9, 0.0, 1.0, Letterbox(1, 0, 0, W, H))
    empty = Detections.empty()
    field = clip.analytics.update(meta, empty, {1}).message_field()
    assert field == {"zones": {"yard": {"car": 1}}, "lines": {"gate": {"in": 1, "out": 0}}}


def test_normalized_points_are_placed_on_the_frame_size():
    clip = Clip(build(lines=[{"name": "mid", "points": [[0.5, 1.0], [0.5, 0.0]], "units": "normalized"}]))
    clip.walk(1, range(280, 380, 10))
    assert clip.kinds() == [("cross", "mid", 1, "in")]
    assert clip.analytics.shapes("cam")[0].points == ((320.0, 480.0), (320.0, 0.0))


def test_untracked_boxes_are_ignored():
    clip = Clip(build(zones=[ZONE]))
    for _ in range(5):
        clip.frame([(-1, 400, 250)])
    assert clip.kinds() == [] and counts(clip.analytics, "yard")["in"] == 0


def test_points_outside_the_frame_are_reported_at_the_first_frame(caplog):
    clip = Clip(build(zones=[{**ZONE, "points": [[300, 100], [900, 100], [500, 400]]}]))
    clip.frame([(1, 100, 100)])
    assert "sources[0].zones[0].points: [900.0, 100.0] is outside the 640x480 frame" in caplog.text


def test_an_unknown_class_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"sources\[0\]\.lines\[0\]\.classes: unknown label\(s\) \['bus'\]"):
        build(lines=[{**LINE, "classes": ["bus"]}])


def test_line_crossings_and_zone_events_reach_their_prometheus_series():
    from app.metrics import PipelineMetrics

    metrics = PipelineMetrics()
    clip = Clip(build(zones=[ZONE], lines=[LINE]))
    clip.walk(1, range(150, 360, 10))
    for event in clip.events:
        metrics.count_event("cam", event)
    sample = metrics.registry.get_sample_value
    assert sample("detstream_line_crossings_total", {"stream": "cam", "line": "gate", "direction": "in",
                                                     "label": "person"}) == 1
    assert sample("detstream_zone_events_total", {"stream": "cam", "zone": "yard", "kind": "enter",
                                                  "label": "person"}) == 1
    assert sample("detstream_zone_occupancy", {"stream": "cam", "zone": "yard", "label": "person"}) == 1
