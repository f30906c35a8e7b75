"""Streams added and removed while batches are taken; the ring sized for them; series and counts forgotten."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import generate_latest

from app.batcher import Batcher
from app.config import parse_config
from app.control import changed_fields, diff_sources
from app.drops import DropLedger, DropReason
from app.metrics import PipelineMetrics
from app.pipeline import _ring_geometry, source_capacity
from app.ring import FrameRing
from app.sources.base import SourceState
from app.types import FrameMeta, Letterbox

BOX = Letterbox(1.0, 0, 0, 8, 8)


def put(batcher: Batcher, stream: str, seq: int) -> None:
    slot = batcher.acquire(stream, threading.Event())
    assert slot is not None
    now = time.monotonic()
    batcher.commit(slot, FrameMeta(stream, seq, None, time.time(), now, 0.0, BOX))


def test_a_stream_added_while_the_engine_waits_is_batched_and_a_removed_one_leaves_the_rotation():
    batcher = Batcher(FrameRing(8, 8, 8), 4, 0.01, 4)
    batcher.add_stream("a", live=False)
    got: list = []
    engine = threading.Thread(target=lambda: got.append(batcher.next_batch(threading.Event())))
    engine.start()
    time.sleep(0.05)
    batcher.add_stream("b", live=True)
    put(batcher, "b", 0)
    engine.join(5)
    assert [s.meta.stream_id for s in got[0].slots] == ["b"]
    with pytest.raises(ValueError, match="holds frames"):
        batcher.remove_stream("b")  # still open, and its slot is in flight
    batcher.close_stream("b")
    with pytest.raises(ValueError, match="held=1"):
        batcher.remove_stream("b")
    batcher.release(got[0].slots)
    batcher.remove_stream("b")
    assert batcher.held("b") == 0 and batcher.ring.free_count == 8
    with pytest.raises(ValueError, match="registered already"):
        batcher.add_stream("a", live=False)


def test_with_no_stream_left_batching_waits_for_new_ones_until_finish():
    batcher = Batcher(FrameRing(4, 8, 8), 4, 0.01, 4)
    batcher.add_stream("a", live=False)
    batcher.close_stream("a")
    assert batcher.next_batch(threading.Event()).ended == ["a"]
    batcher.remove_stream("a")
    result: list = []
    engine = threading.Thread(target=lambda: result.append(batcher.next_batch(threading.Event())))
    engine.start()
    engine.join(0.3)
    assert engine.is_alive(), "an empty batcher is not the end of the run"
    batcher.finish()
    engine.join(5)
    assert result == [None]


def test_a_lowered_quota_holds_a_stream_back_until_it_is_under_it():
    batcher = Batcher(FrameRing(8, 8, 8), 8, 0.01, 4)
    batcher.add_stream("a", live=False)
    for seq in range(3):
        put(batcher, "a", seq)
    batcher.set_quota(2)
    stop = threading.Event()
    stop.set()
    assert batcher.acquire("a", stop) is None


def _config(sources: int, **engine):
    return parse_config({"sources": [{"id": f"s{i}", "url": f"/c/{i}.mp4"} for i in range(sources)],
                         "engine": {"max_batch": 4, **engine}})


def test_the_ring_is_sized_for_max_sources_and_unchanged_without_it():
    assert _ring_geometry(_config(2), 4) == (8, 4)  # the configured streams only: as before
    assert source_capacity(_config(2)) == 2
    assert source_capacity(_config(2, max_sources=6)) == 6
    slots, quota = _ring_geometry(_config(2, max_sources=6), 4)
    assert slots == 18 and quota == 4  # three per stream for six, and the two running keep their share
    with_http = parse_config({"sources": [{"url": "/c/a.mp4"}], "http": {"enabled": True}})
    assert source_capacity(with_http) == 5


def test_metrics_series_and_ledger_counts_of_a_removed_stream_are_forgotten():
    metrics = PipelineMetrics()
    ledger = DropLedger(metrics)
    for stream in ("gone", "kept"):
        ledger.add_stream(stream)
        ledger.publish(stream)
        ledger.drop(stream, DropReason.LIVE_POLICY, 2)
        metrics.count_decoded(stream)
        metrics.set_state(stream, SourceState.RUNNING)
        metrics.reconnects.labels(stream=stream, error_class="timeout").inc()
    metrics.remove("gone")
    ledger.forget("gone")
    text = generate_latest(metrics.registry).decode()
    assert 'stream="gone"' not in text and text.count('stream="kept"') >= 8
    assert ledger.dropped("gone") == 0 and ledger.counts("kept").published == 1
    metrics.count_decoded("gone")  # the id can come back, counting from zero
    assert 'detstream_frames_decoded_total{stream="gone"} 1.0' in generate_latest(metrics.registry).decode()


def test_diff_sources_says_what_to_add_remove_and_change():
    old = {s.id: s for s in _config(3).sources}
    new = [*_config(3).sources[1:], parse_config({"sources": [{"id": "s9", "url": "/c/9.mp4"}]}).sources[0]]
    new[0] = new[0].model_copy(update={"max_fps": 5.0})
    diff = diff_sources(old, new)
    assert [s.id for s in diff.added] == ["s9"] and diff.removed == ["s0"] and list(diff.changed) == ["s1"]
    assert changed_fields(old["s1"], diff.changed["s1"]) == {"max_fps"}
    assert diff_sources(old, list(old.values())).empty
