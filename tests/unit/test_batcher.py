"""Batcher: admission policies per stream and cross-stream batching, with real threads."""

import threading
import time

import numpy as np
import pytest

from app.batcher import Batcher
from app.ring import FrameRing
from app.types import FrameMeta, Letterbox

BOX = Letterbox(1.0, 0, 0, 8, 8)


def meta(stream: str, seq: int, age_s: float = 0.0) -> FrameMeta:
    now = time.monotonic()
    return FrameMeta(stream, seq, None, time.time(), now - age_s, 0.0, BOX)


def make(streams: dict[str, bool], quota: int = 4, max_batch: int = 4, max_wait_s: float = 0.05,
         staleness_s: float = 0.5) -> Batcher:
    batcher = Batcher(FrameRing(quota * len(streams), 8, 8), max_batch, max_wait_s, quota)
    for stream, live in streams.items():
        batcher.add_stream(stream, live, staleness_s)
    return batcher


def put(batcher: Batcher, stream: str, seq: int, age_s: float = 0.0) -> None:
    slot = batcher.acquire(stream, threading.Event())
    assert slot is not None
    batcher.commit(slot, meta(stream, seq, age_s))


def test_a_batch_closes_as_soon_as_it_is_full():
    batcher = make({"a": False}, quota=8, max_batch=4, max_wait_s=10.0)
    for seq in range(5):
        put(batcher, "a", seq)
    started = time.monotonic()
    batch = batcher.next_batch(threading.Event())
    assert [s.meta.seq for s in batch.slots] == [0, 1, 2, 3]
    assert time.monotonic() - started < 1.0


def test_a_partial_batch_closes_after_the_wait_window():
    batcher = make({"a": False}, max_batch=4, max_wait_s=0.1)
    put(batcher, "a", 0)
    started = time.monotonic()
    batch = batcher.next_batch(threading.Event())
    waited = time.monotonic() - started
    assert len(batch.slots) == 1
    assert 0.08 <= waited < 1.0


def test_frames_are_taken_round_robin_across_streams():
    batcher = make({"a": False, "b": False, "c": False}, quota=4, max_batch=6, max_wait_s=10.0)
    for seq in range(4):
        put(batcher, "a", seq)
    put(batcher, "b", 0)
    put(batcher, "c", 0)
    batch = batcher.next_batch(threading.Event())
    streams = [s.meta.stream_id for s in batch.slots]
    assert sorted(streams[:3]) == ["a", "b", "c"]
    assert streams.count("a") == 4


def test_file_streams_block_at_their_quota_and_resume_on_release():
    batcher = make({"a": False}, quota=2)
    put(batcher, "a", 0)
    put(batcher, "a", 1)
    got: list = []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: got.append(batcher.acquire("a", stop)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "a file stream over its quota must wait, not drop"
    batch = batcher.next_batch(threading.Event())
    batcher.release(batch.slots)
    waiter.join(2.0)
    assert got and got[0] is not None
    assert batcher.dropped("a") == 0


def test_live_streams_reclaim_their_oldest_waiting_frame_and_count_it():
    batcher = make({"cam": True}, quota=2)
    put(batcher, "cam", 0)
    put(batcher, "cam", 1)
    put(batcher, "cam", 2)  # over quota: frame 0 is dropped, not the decoder blocked
    assert batcher.dropped("cam") == 1
    batch = batcher.next_batch(threading.Event())
    assert [s.meta.seq for s in batch.slots] == [1, 2]


def test_a_bursting_live_camera_cannot_take_slots_from_another_stream():
    batcher = make({"burst": True, "quiet": True}, quota=2)
    for seq in range(50):
        put(batcher, "burst", seq)
    put(batcher, "quiet", 0)
    assert batcher.dropped("quiet") == 0
    assert batcher.dropped("burst") == 48


def test_stale_live_frames_never_reach_the_engine():
    batcher = make({"cam": True}, quota=4, staleness_s=0.2)
    put(batcher, "cam", 0, age_s=1.0)
    put(batcher, "cam", 1)
    batch = batcher.next_batch(threading.Event())
    assert [s.meta.seq for s in batch.slots] == [1]
    assert batcher.dropped("cam") == 1


def test_a_closed_stream_is_reported_ended_only_after_its_last_frame_is_taken():
    batcher = make({"a": False, "b": False}, quota=4, max_batch=2, max_wait_s=0.01)
    for seq in range(3):
        put(batcher, "a", seq)
    batcher.close_stream("a")
    first = batcher.next_batch(threading.Event())
    assert first.ended == []
    second = batcher.next_batch(threading.Event())
    assert [s.meta.seq for s in second.slots] == [2] and second.ended == ["a"]
    batcher.close_stream("b")
    last = batcher.next_batch(threading.Event())
    assert last.slots == [] and last.ended == ["b"]
    assert batcher.next_batch(threading.Event()) is None


@pytest.mark.parametrize("stop_while_waiting", [True])
def test_acquire_returns_none_when_stopping(stop_while_waiting):
    batcher = make({"a": False}, quota=1)
    put(batcher, "a", 0)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert batcher.acquire("a", stop) is None


def put_shaped(batcher: Batcher, stream: str, seq: int, hw: tuple[int, int]) -> None:
    slot = batcher.acquire(stream, threading.Event())
    assert slot is not None
    slot.shape_to(*hw)
    batcher.commit(slot, meta(stream, seq))


def test_a_batch_holds_one_input_size_and_the_other_size_goes_next():
    batcher = make({"wide": False, "tall": False}, quota=4, max_batch=8, max_wait_s=0.0)
    for seq in range(2):
        put_shaped(batcher, "wide", seq, (4, 8))
        put_shaped(batcher, "tall", seq, (8, 4))
    first = batcher.next_batch(threading.Event())
    second = batcher.next_batch(threading.Event())
    for batch in (first, second):
        assert len({s.array.shape for s in batch.slots}) == 1
    taken = sorted((s.meta.stream_id, s.meta.seq) for s in first.slots + second.slots)
    assert taken == [("tall", 0), ("tall", 1), ("wide", 0), ("wide", 1)]


def test_a_slot_view_is_contiguous_and_shares_the_preallocated_buffer():
    ring = FrameRing(1, 8, 8)
    slot = ring.slots[0]
    view = slot.shape_to(4, 8)
    assert view.shape == (3, 4, 8) and view.flags.c_contiguous
    view[:] = 7.0
    assert np.shares_memory(view, ring.buffer) and (slot.buffer.reshape(-1)[: view.size] == 7.0).all()
    with pytest.raises(ValueError, match="does not fit"):
        slot.shape_to(16, 8)
