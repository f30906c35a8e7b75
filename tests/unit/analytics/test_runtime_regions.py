"""Zones and lines replaced while a stream runs: what keeps its counts, what starts afresh, what ends."""

from __future__ import annotations

from app.analytics.config import LineConfig, ZoneConfig
from app.config import SourceConfig
from tests.unit.analytics.test_engine import LINE, NAMES, ZONE, Clip, build, counts

GATE = LineConfig.model_validate(LINE)
YARD = ZoneConfig.model_validate(ZONE)


def test_adding_a_zone_keeps_the_unchanged_lines_counts_and_a_changed_line_starts_from_zero():
    clip = Clip(build(lines=[LINE]))
    clip.walk(1, range(150, 260, 10))
    assert counts(clip.analytics, "gate")["in"] == 1

    ended = clip.analytics.set_stream("cam", [YARD], [GATE])
    assert ended == [] and counts(clip.analytics, "gate")["in"] == 1 and counts(clip.analytics, "yard")["in"] == 0
    clip.walk(2, range(150, 260, 10))
    assert counts(clip.analytics, "gate")["in"] == 2

    moved = GATE.model_copy(update={"points": [(100, 400), (100, 100)]})
    assert clip.analytics.set_stream("cam", [YARD], [moved]) == ["gate"]
    assert counts(clip.analytics, "gate")["in"] == 0
    assert [s.name for s in clip.analytics.shapes("cam")] == ["yard", "gate"]


def test_a_kept_zone_still_hears_that_its_tracks_are_lost_after_the_change():
    clip = Clip(build(zones=[ZONE]))
    clip.walk(1, [400, 400, 400])
    assert counts(clip.analytics, "yard")["occupancy"] == 1
    clip.analytics.set_stream("cam", [YARD], [GATE])
    events = clip.frame([], alive=[])
    assert [(e.kind, e.region, e.reason) for e in events] == [("exit", "yard", "lost")]
    assert counts(clip.analytics, "yard")["occupancy"] == 0


def test_removing_every_region_ends_the_streams_analytics_and_a_new_stream_can_gain_some():
    clip = Clip(build(zones=[ZONE], lines=[LINE]))
    assert sorted(clip.analytics.set_stream("cam", [], [])) == ["gate", "yard"]
    assert "cam" not in clip.analytics and clip.analytics.counts("cam") == {} and clip.analytics.shapes("cam") == ()
    assert clip.analytics.streams == []
    assert clip.analytics.set_stream("cam", [], [GATE]) == []
    clip.walk(2, range(150, 260, 10))
    assert counts(clip.analytics, "gate")["in"] == 1


def test_the_class_check_names_the_field_of_a_source_on_its_own_or_in_a_config():
    analytics = build()
    source = SourceConfig(id="new", url="cam.mp4", zones=[{**ZONE, "classes": ["person", "bus"]}])
    field, message = analytics.check(source)
    assert field == "zones[0].classes" and message.startswith("zones[0].classes: unknown label(s) ['bus']")
    assert analytics.check(source, 3)[0] == "sources[3].zones[0].classes"
    assert analytics.check(SourceConfig(id="ok", url="cam.mp4", lines=[{**LINE, "classes": list(NAMES)}])) is None
