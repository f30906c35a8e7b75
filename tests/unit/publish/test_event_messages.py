"""Zone and line events as ``detstream.event/1`` maps, and the ``analytics`` addition to detection messages."""

from __future__ import annotations

import dataclasses

import pytest

from app.analytics.engine import Event, FrameAnalytics
from app.analytics.regions import Shape
from app.publish.messages import (
    decode,
    detection_payload,
    encode,
    event_payload,
    event_topic,
    validate_detection,
    validate_event,
)
from app.subscribe.messages import DetectionMessage, EventMessage
from tests.unit.publish.test_messages import NAMES, frame_result

LINE_COUNTS = {"in": 1, "out": 0, "labels": {"person": {"in": 1, "out": 0}}}
ZONE_COUNTS = {"in": 2, "out": 1, "occupancy": 1, "labels": {"person": {"in": 2, "out": 1, "occupancy": 1}}}
CROSS = Event("cross", "line", "gate", 42, "person", 0.9345, (10.0, 20.0, 50.0, 120.0), "in", None, LINE_COUNTS)
LOST = Event("exit", "zone", "yard", 7, "person", None, None, None, "lost", ZONE_COUNTS)


def test_an_event_payload_has_the_contract_fields_and_validates():
    p = event_payload("cam", CROSS, seq=12, pts=1.2, at=1763770000.5)
    assert p == {"schema": "detstream.event/1", "stream": "cam", "seq": 12, "pts": 1.2, "at": 1763770000.5,
                 "kind": "cross", "line": "gate", "direction": "in", "reason": None, "track_id": 42,
                 "label": "person", "score": 0.9345, "box": [10.0, 20.0, 50.0, 120.0], "counts": LINE_COUNTS}
    assert validate_event(p) == []
    assert event_topic("cam") == b"event/cam/"


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_lost_exit_has_no_box_and_round_trips_through_both_encodings(encoding: str):
    p = event_payload("cam", LOST, seq=99, pts=None, at=1763770001.0)
    assert p["zone"] == "yard" and "line" not in p and p["reason"] == "lost" and p["box"] is None
    back = decode(encode(p, encoding), encoding)
    assert back == p and validate_event(back) == []
    message = EventMessage.from_payload(back)
    assert (message.kind, message.region, message.region_kind, message.track_id) == ("exit", "yard", "zone", 7)


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("kind", "teleport", "kind: expected enter | exit | cross | dwell"),
    ("direction", "up", "direction: expected in, out or null"),
    ("counts", {"in": 1}, "counts: expected a map of in, out"),
    ("line", 3, "zone/line: expected exactly one of them as a string"),
    ("score", 1.5, "score: expected a number in [0, 1] or null"),
])
def test_the_event_validator_names_each_problem(key: str, value, problem: str):
    p = event_payload("cam", CROSS, seq=1, pts=None, at=1.0) | {key: value}
    assert any(problem in line for line in validate_event(p)), validate_event(p)


def test_a_zone_and_a_line_name_together_are_refused():
    p = event_payload("cam", CROSS, seq=1, pts=None, at=1.0) | {"zone": "yard"}
    assert validate_event(p) == ["zone/line: expected exactly one of them as a string, got ['zone', 'line']"]


def test_detection_messages_carry_zone_occupancy_per_class_and_line_totals_when_the_source_has_regions():
    analytics = FrameAnalytics((), (Shape("yard", "zone", ()), Shape("gate", "line", ())),
                               {"yard": ZONE_COUNTS, "gate": LINE_COUNTS})
    result = dataclasses.replace(frame_result(), analytics=analytics)
    p = detection_payload(result, model="m", engine="e", published_at=1.0, dropped_before=0, class_names=NAMES)
    assert p["analytics"] == {"zones": {"yard": {"person": 1}}, "lines": {"gate": {"in": 1, "out": 0}}}
    assert validate_detection(p) == []
    assert DetectionMessage.from_payload(p).analytics == p["analytics"]
    assert "analytics" not in detection_payload(frame_result(), model="m", engine="e", published_at=1.0,
                                                dropped_before=0, class_names=NAMES)
    assert validate_detection(p | {"analytics": [1]}) == ["analytics: expected a map with zones, got [1]"]
