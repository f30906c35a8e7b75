"""Per-stream ByteTrack: ids follow moving boxes, streams are independent, reset forgets."""

from __future__ import annotations

import numpy as np

from app.postprocess.tracking import StreamTrackers
from app.types import Detections


def dets(boxes, scores=None) -> Detections:
    xyxy = np.array(boxes, np.float32).reshape(-1, 4)
    n = len(xyxy)
    return Detections(xyxy, np.array(scores if scores is not None else [0.9] * n, np.float32),
                      np.zeros(n, np.int32))


def moving(frame: int, x0: float = 10, y0: float = 10, dx: float = 6, dy: float = 2):
    return [x0 + dx * frame, y0 + dy * frame, x0 + dx * frame + 50, y0 + dy * frame + 80]


def test_a_moving_box_keeps_its_id_across_frames():
    trackers = StreamTrackers()
    ids = [trackers.update("cam", dets([moving(i)]), 30.0).track_ids[0] for i in range(20)]
    assert ids[0] > 0 and set(ids) == {ids[0]}


def test_two_objects_get_distinct_stable_ids_even_when_the_input_order_swaps():
    trackers = StreamTrackers()
    seen = []
    for i in range(12):
        a, b = moving(i), moving(i, x0=400, dx=-6)
        rows = [a, b] if i % 2 == 0 else [b, a]
        ids = trackers.update("cam", dets(rows), 30.0).track_ids
        seen.append((ids[0], ids[1]) if i % 2 == 0 else (ids[1], ids[0]))
    assert len(set(seen)) == 1 and seen[0][0] != seen[0][1]


def test_every_detection_is_kept_and_untracked_ones_have_minus_one():
    trackers = StreamTrackers()
    trackers.update("cam", dets([moving(0)]), 30.0)
    out = trackers.update("cam", dets([moving(1), [300, 300, 340, 380], [500, 10, 540, 60]], [0.9, 0.9, 0.05]), 30.0)
    assert len(out) == 3
    assert out.track_ids[0] > 0
    assert out.track_ids[1] == -1  # first sighting after frame 1: not confirmed yet
    assert out.track_ids[2] == -1  # too low a score to track


def test_update_does_not_modify_its_input():
    trackers = StreamTrackers()
    given = dets([moving(0)])
    out = trackers.update("cam", given)
    assert out is not given and given.track_ids.tolist() == [-1] and out.track_ids.tolist() == [1]
    assert not np.shares_memory(out.xyxy, given.xyxy)


def test_streams_have_their_own_trackers_and_ids():
    trackers = StreamTrackers()
    a = trackers.update("a", dets([moving(0)]), 30.0).track_ids
    b = trackers.update("b", dets([moving(0, x0=300)]), 30.0).track_ids
    assert a.tolist() == [1] and b.tolist() == [1] and len(trackers) == 2


def test_reset_forgets_the_stream_and_numbering_starts_again():
    trackers = StreamTrackers()
    for i in range(5):
        trackers.update("cam", dets([moving(i), moving(i, x0=300)]), 30.0)
    trackers.reset("cam")
    assert "cam" not in trackers
    out = trackers.update("cam", dets([[600, 400, 640, 470]]), 30.0)
    assert out.track_ids.tolist() == [1]


def test_a_box_that_vanishes_briefly_is_found_again_with_the_same_id():
    trackers = StreamTrackers()
    ids = [trackers.update("cam", dets([moving(i)]), 30.0).track_ids[0] for i in range(10)]
    for _ in range(3):
        trackers.update("cam", Detections.empty(), 30.0)
    back = trackers.update("cam", dets([moving(13)]), 30.0).track_ids[0]
    assert back == ids[-1]


