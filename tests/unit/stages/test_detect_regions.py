"""The detector takes zones and lines changed from another thread at its next batch, and tracks accordingly."""

from __future__ import annotations

import threading
import time

from app.analytics.config import LineConfig, ZoneConfig
from app.config import parse_config
from app.stages.detect import Detector, RegionChange
from app.types import FrameMeta, Letterbox
from tests.fakes import FixedEngine

ENGINE = FixedEngine()
BOX = Letterbox(1.0, 0.0, 0.0, 64, 64)
ALL = ZoneConfig(name="all", points=[(0, 0), (64, 0), (64, 64), (0, 64)])
DOOR = LineConfig(name="door", points=[(10, 0), (10, 64)])


class Frames:
    """Feeds one-frame batches of stream ``cam`` (the fixed engine's box) to a detector."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector
        self.seq = 0

    def next(self):
        meta = FrameMeta("cam", self.seq, None, time.time(), time.monotonic(), 1.0, BOX)
        self.seq += 1
        (result,) = self.detector.detect(ENGINE.submit([None]).wait(), [meta], t_submit=0.0, t_done=0.0)
        return result


def test_a_stream_gains_a_zone_at_the_next_batch_is_tracked_then_and_untracked_when_it_loses_it(caplog):
    config = parse_config({"sources": [{"id": "cam", "url": "rtsp://h/s"}]}, env={})
    detector = Detector(ENGINE.spec, config)
    frames = Frames(detector)
    assert frames.next().analytics is None and frames.next().detections.track_ids.tolist() == [-1]

    ended: list[list[str]] = []
    change = RegionChange("cam", (ALL,), (), lambda names: ended.append(names))
    caller = threading.Thread(target=detector.set_regions, args=(change,))
    caller.start()
    caller.join()
    assert ended == [] and "cam" not in detector.analytics, "nothing changes before the postprocess thread's batch"
    with caplog.at_level("INFO"):
        first = frames.next()
    assert ended == [[]] and "'cam' has zones or lines: tracking is on" in caplog.text
    assert first.detections.track_ids.tolist() == [1] and first.analytics.message_field()["zones"] == {"all": {}}
    assert [e.kind for e in frames.next().analytics.events] == ["enter"]

    detector.set_regions(RegionChange("cam", (ALL,), (DOOR,), ended.append))
    assert frames.next().analytics.message_field() == {"zones": {"all": {"person": 1}},
                                                       "lines": {"door": {"in": 0, "out": 0}}}
    assert ended[-1] == [], "the unchanged zone keeps its count and its track"

    detector.set_regions(RegionChange("cam", (), (), ended.append))
    last = frames.next()
    assert sorted(ended[-1]) == ["all", "door"] and last.analytics is None
    assert last.detections.track_ids.tolist() == [-1], "back to tracking: none"


def test_with_tracking_on_for_all_a_removed_zone_leaves_the_stream_tracked():
    config = parse_config({"sources": [{"id": "cam", "url": "rtsp://h/s", "zones": [ALL.model_dump()]}],
                           "tracking": "bytetrack"}, env={})
    detector = Detector(ENGINE.spec, config)
    frames = Frames(detector)
    assert frames.next().analytics is not None
    detector.set_regions(RegionChange("cam", (), ()))
    result = frames.next()
    assert result.analytics is None and result.detections.track_ids.tolist() == [1]
