"""Zones and lines end to end: `detstream run` on real pixels, events and counts read with a plain pyzmq SUB.

1. A clip built from people cut out of vtest.avi and moved along known paths
   (tests/integration/analytics_clip.py): the events and final counts equal
   the ground truth exactly.
2. vtest.avi itself with a line across the middle: the published counts equal
   a count the test recomputes, in its own way, from the published track boxes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from app.publish.messages import validate_detection, validate_event
from tests.conftest import Collector, detstream, free_port
from tests.integration.analytics_clip import EXPECTED, LINE, ZONE, build_clip


def _run(tmp_path: Path, source: dict) -> tuple[list[tuple[str, dict]], str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "analytics.yaml"
    config.write_text(yaml.safe_dump({"sources": [source], "publish": {"endpoint": endpoint}}))
    collector = Collector(endpoint).start()
    result = detstream("run", str(config), "--no-progress", timeout_s=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return collector.stop(), result.stderr


def test_events_and_counts_on_a_clip_with_known_paths_equal_the_ground_truth(vtest, default_model, tmp_path):
    clip = build_clip(vtest, tmp_path / "walkers.mp4")
    source = {"id": "walk", "url": str(clip), "mode": "file", "lines": [{**LINE, "classes": ["person"]}],
              "zones": [{**ZONE, "classes": ["person"]}]}
    messages, log = _run(tmp_path, source)
    events = [p for topic, p in messages if topic == "event/walk/"]
    assert events and all(validate_event(e) == [] for e in events)

    crossings = [e["direction"] for e in events if e.get("line") == "door"]
    assert sorted(crossings) == ["in"] * EXPECTED["door"]["in"] + ["out"] * EXPECTED["door"]["out"]
    door = [e for e in events if e.get("line") == "door"][-1]["counts"]
    assert {k: door[k] for k in ("in", "out")} == EXPECTED["door"]
    assert door["labels"] == {"person": {"in": 6, "out": 3}}

    bench = [e for e in events if e.get("zone") == "bench"]
    assert [e["kind"] for e in bench] == [kind for kind, _ in EXPECTED["bench_events"]]
    people: dict[str, int] = {}
    for event, (_, who) in zip(bench, EXPECTED["bench_events"], strict=True):
        assert people.setdefault(who, event["track_id"]) == event["track_id"]  # one track per visitor
    assert len(set(people.values())) == 3
    assert [e["reason"] for e in bench] == [None] * 7 + ["lost"]  # S2 still stands there when the clip ends
    assert {k: bench[-1]["counts"][k] for k in ("in", "out", "occupancy")} == EXPECTED["bench"]

    detections = [p for topic, p in messages if topic == "det/walk/"]
    assert len(detections) == 290 and all(validate_detection(p) == [] for p in detections)
    assert detections[-1]["analytics"] == {"zones": {"bench": {"person": 1}}, "lines": {"door": {"in": 6, "out": 3}}}
    dwell_s2 = next(e for e in bench if e["kind"] == "dwell" and e["track_id"] == people["S2"])
    assert detections[dwell_s2["seq"]]["analytics"]["zones"]["bench"] == {"person": 1}
    terminal = next(i for i, (topic, p) in enumerate(messages) if topic == "status/walk/" and p["state"] == "ended")
    assert messages.index(("event/walk/", bench[-1])) < terminal  # the lost exit comes before the end
    assert "door: in 6 (person 6), out 3 (person 3)" in log and "bench: in 3 (person 3), out 3 (person 3), now 0" in log


def _side(point: tuple[float, float], a: list[float], b: list[float]) -> int:
    cross = (b[0] - a[0]) * (point[1] - a[1]) - (b[1] - a[1]) * (point[0] - a[0])
    return (cross > 0) - (cross < 0)


def _through_segment(p: tuple[float, float], q: tuple[float, float], a: list[float], b: list[float]) -> bool:
    return _side(p, a, b) != _side(q, a, b) and _side(a, p, q) * _side(b, p, q) <= 0


def recount(detections: list[dict], line: dict, min_frames: int = 2) -> dict[str, int]:
    """Crossings from the published boxes: per track, runs of frames on one side of the line; a run on the other
    side that lasts ``min_frames`` is a crossing when the step into it passed through the segment."""
    a, b = line["points"]
    paths: dict[int, list[tuple[int, tuple[float, float]]]] = {}
    for message in detections:
        for d in message["detections"]:
            if d["track_id"] is not None and d["label"] == "person":
                x1, _, x2, y2 = d["box"]
                point = ((x1 + x2) / 2, y2)
                side = _side(point, a, b)
                if side:
                    paths.setdefault(d["track_id"], []).append((side, point))
    counts = {"in": 0, "out": 0}
    for path in paths.values():
        runs: list[list[tuple[int, tuple[float, float]]]] = []
        for step in path:
            if runs and runs[-1][0][0] == step[0]:
                runs[-1].append(step)
            else:
                runs.append([step])
        confirmed, previous = runs[0][0][0], runs[0]
        for run in runs[1:]:
            if run[0][0] != confirmed and len(run) >= min_frames:
                if _through_segment(previous[-1][1], run[0][1], a, b):
                    counts["in" if run[0][0] == 1 else "out"] += 1
                confirmed = run[0][0]
            if run[0][0] == confirmed:
                previous = run
    return counts


def test_line_counts_on_vtest_match_a_recount_from_the_published_track_boxes(vtest, default_model, tmp_path):
    line = {"name": "middle", "points": [[384, 560], [384, 120]], "classes": ["person"]}
    messages, _ = _run(tmp_path, {"id": "vtest", "url": str(vtest), "mode": "file", "lines": [line]})
    detections = [p for topic, p in messages if topic == "det/vtest/"]
    assert len(detections) == 795
    published = detections[-1]["analytics"]["lines"]["middle"]
    expected = recount(detections, line)
    assert published == expected
    assert published["in"] + published["out"] >= 4  # people do walk across the middle of vtest
    crossings = [p for topic, p in messages if topic == "event/vtest/"]
    assert len(crossings) == published["in"] + published["out"]
