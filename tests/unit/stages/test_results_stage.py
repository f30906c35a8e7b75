"""The results stage with real threads and fakes passed in: drop accounting by reason, and routing to sinks.

Frames are handed to the batcher by the test (standing in for decoders); the engine is a fake that returns one
box per frame and can fail a chosen call; the publisher and the sink are in-memory.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import pytest

from app.batcher import Batcher
from app.config import parse_config
from app.drops import DropLedger, DropReason
from app.errors import ConfigError
from app.metrics import PipelineMetrics
from app.pipeline import RunReport
from app.ring import FrameRing
from app.sources.base import SourceState, SourceStatus
from app.stages.detect import Detector
from app.stages.inference import InferenceStage
from app.stages.results import ResultsStage
from app.types import FrameMeta, Letterbox
from tests.fakes import FixedEngine, MemoryPublisher, MemorySink

SPEC = FixedEngine().spec
BOX = Letterbox(1.0, 0.0, 0.0, 64, 64)


class Run:
    """A batcher with a file stream ``f`` and a live stream ``cam``, and the engine and results stages behind it."""

    def __init__(self, engine: FixedEngine, sinks: Sequence[MemorySink] = (), quota: int = 4,
                 file_source: dict | None = None) -> None:
        sources = [{"id": "f", "url": "/clips/f.mp4", **(file_source or {})}, {"id": "cam", "url": "rtsp://h/s"}]
        self.config = parse_config({"sources": sources, "engine": {"max_batch": 4}}, env={})
        self.metrics = PipelineMetrics()
        self.ledger = DropLedger(self.metrics)
        self.batcher = Batcher(FrameRing(2 * quota, 64, 64), 4, 0.01, quota, drops=self.ledger)
        self.batcher.add_stream("f", live=False)
        self.batcher.add_stream("cam", live=True, max_staleness_s=60.0)
        self.publisher = MemoryPublisher()
        self.statuses: queue.SimpleQueue[SourceStatus] = queue.SimpleQueue()
        submitted: queue.Queue = queue.Queue(maxsize=2)
        self.engine = engine
        self.results = ResultsStage(self.config, Detector(SPEC, self.config), engine.backend, batcher=self.batcher,
                                    submitted=submitted, statuses=self.statuses, publisher=self.publisher,
                                    sinks=sinks, ledger=self.ledger, metrics=self.metrics)
        self.inference = InferenceStage(self.batcher, engine, submitted, self.metrics, threading.Event())
        self.handed_over = {"f": 0, "cam": 0}

    def put(self, stream: str, frames: int) -> None:
        """``frames`` decoded frames of ``stream``, as a decoder hands them over (live ones may displace older)."""
        for _ in range(frames):
            slot = self.batcher.acquire(stream, threading.Event())
            assert slot is not None
            seq = self.handed_over[stream]
            self.batcher.commit(slot, FrameMeta(stream, seq, None, time.time(), time.monotonic(), 1.0, BOX))
            self.handed_over[stream] += 1

    def no_slot(self, stream: str, frames: int) -> None:
        """``frames`` decoded frames a live decoder found no slot for."""
        self.batcher.count_drop(stream, frames)
        self.handed_over[stream] += frames

    def run_to_end(self) -> None:
        for stream in self.handed_over:
            self.statuses.put(SourceStatus(stream, SourceState.RUNNING))
            self.batcher.close_stream(stream)
        self.results.start()
        self.inference.start()
        assert self.inference.join(10) and self.results.join(10), "the run did not end"

    def prometheus(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def test_drops_by_reason_add_up_to_the_status_the_report_the_progress_and_prometheus():
    run = Run(FixedEngine(fail_on_call=1))
    run.put("f", 4)
    run.put("cam", 10)  # quota 4: the six oldest are displaced by the live policy
    run.no_slot("cam", 2)
    run.run_to_end()

    snapshots = run.results.streams()
    report = RunReport(streams=snapshots, engine="fixed:test", elapsed_s=1.0)
    assert run.engine.batches[0] == 4  # the failed batch: four frames lost to the engine error
    assert sum(run.ledger.counts(s).dropped_by_reason.get(DropReason.ENGINE_ERROR, 0) for s in snapshots) == 4
    assert run.ledger.counts("cam").dropped_by_reason[DropReason.LIVE_POLICY] == 8
    assert DropReason.LIVE_POLICY not in run.ledger.counts("f").dropped_by_reason  # a file stream never drops by policy
    for stream, handed_over in run.handed_over.items():
        counts, snapshot = run.ledger.counts(stream), snapshots[stream]
        by_reason = dict(counts.dropped_by_reason)
        assert counts.published + sum(by_reason.values()) == handed_over, stream  # every frame accounted for once
        assert len(run.publisher.of(stream)) == counts.published == snapshot.published == report.published[stream]
        final = run.publisher.of(stream, "statuses")[-1]
        assert final["state"] == "ended"
        assert final["dropped"] == sum(by_reason.values()) == snapshot.dropped == report.dropped[stream]
        assert report.dropped_by_reason[stream] == by_reason
        assert snapshot.state is SourceState.ENDED and report.states[stream] is SourceState.ENDED
        for reason in DropReason:
            assert run.prometheus("detstream_frames_dropped_total", stream=stream,
                                  reason=reason.value) == by_reason.get(reason, 0), (stream, reason)
        assert run.prometheus("detstream_frames_published_total", stream=stream) == counts.published
        gaps = sum(d["dropped_before"] for d in run.publisher.of(stream))
        assert gaps <= snapshot.dropped  # a subscriber's seq gaps never exceed what was counted
    assert run.prometheus("detstream_engine_batch_failures_total") == 1
    assert run.publisher.closed


def test_a_second_sink_receives_every_published_frame_in_order_with_its_drop_policy():
    sink = MemorySink()
    run = Run(FixedEngine(), sinks=[sink])
    run.put("f", 4)
    run.put("cam", 3)
    run.run_to_end()
    published = [(d["stream"], d["seq"]) for d in run.publisher.detections]
    assert len(published) == 7
    assert [(r.meta.stream_id, r.meta.seq) for r in sink.results] == published
    assert all(len(r.detections) == 1 for r in sink.results)
    assert [lossless for r, lossless in zip(sink.results, sink.lossless, strict=True)
            if r.meta.stream_id == "f"] == [True] * 4  # file frames are kept; live ones may be dropped by the sink
    assert not any(lossless for r, lossless in zip(sink.results, sink.lossless, strict=True)
                   if r.meta.stream_id == "cam")


def test_a_failing_sink_is_detached_and_every_frame_is_still_published(caplog):
    failing, healthy = MemorySink(fail_after=2), MemorySink()
    run = Run(FixedEngine(), sinks=[failing, healthy])
    run.put("f", 4)
    run.run_to_end()
    assert [d["seq"] for d in run.publisher.of("f")] == [0, 1, 2, 3]
    assert len(failing.results) == 2 and len(healthy.results) == 4
    assert sum("sink memory failed; detaching it" in r.getMessage() for r in caplog.records) == 1


def test_latency_metrics_come_from_the_frame_results():
    run = Run(FixedEngine())
    run.put("f", 3)
    run.run_to_end()
    for stage in ("decode", "queue", "infer", "post", "total"):
        assert run.prometheus("detstream_latency_seconds_count", stage=stage) == 3, stage
    assert run.prometheus("detstream_latency_seconds_sum", stage="decode") == pytest.approx(0.003)  # 1 ms each


def test_an_unknown_class_in_the_filter_is_a_config_error():
    config = parse_config({"sources": [{"id": "f", "url": "/clips/f.mp4"}], "model": {"classes": ["dog"]}}, env={})
    with pytest.raises(ConfigError, match=r"unknown label\(s\) \['dog'\]"):
        Detector(SPEC, config)


def test_zone_events_are_published_after_their_frame_counted_in_prometheus_and_a_lost_exit_ends_the_stream():
    """The fixed engine's box stands still inside the zone: enter on the second frame, lost exit at the end."""
    zone = {"name": "all", "points": [[0, 0], [64, 0], [64, 64], [0, 64]]}
    run = Run(FixedEngine(), file_source={"zones": [zone]})
    run.put("f", 4)
    run.run_to_end()
    events = run.publisher.of("f", "events")
    assert [(e["kind"], e["zone"], e["seq"], e["reason"]) for e in events] == [("enter", "all", 1, None),
                                                                              ("exit", "all", 3, "lost")]
    assert events[-1]["counts"] == {"in": 1, "out": 1, "occupancy": 0,
                                    "labels": {"person": {"in": 1, "out": 1, "occupancy": 0}}}
    detections = run.publisher.of("f")
    assert [d["analytics"]["zones"] for d in detections] == [{"all": {}}] + [{"all": {"person": 1}}] * 3
    assert all("analytics" not in d for d in run.publisher.of("cam"))
    assert run.prometheus("detstream_zone_events_total", stream="f", zone="all", kind="enter", label="person") == 1
    assert run.prometheus("detstream_zone_events_total", stream="f", zone="all", kind="exit", label="person") == 1
    assert run.prometheus("detstream_zone_occupancy", stream="f", zone="all", label="person") == 0
    assert run.results.streams()["f"].counts["all"]["in"] == 1


def test_a_source_with_zones_or_lines_is_tracked_and_others_are_not_when_tracking_is_none(caplog):
    zone = {"name": "all", "points": [[0, 0], [64, 0], [64, 64], [0, 64]]}
    config = parse_config({"sources": [{"id": "f", "url": "/clips/f.mp4", "zones": [zone]},
                                       {"id": "cam", "url": "rtsp://h/s"}]}, env={})
    with caplog.at_level("INFO"):
        detector = Detector(SPEC, config)
    assert caplog.text.count("has zones or lines: tracking is on") == 1 and "'f'" in caplog.text
    engine = FixedEngine()
    for seq in range(3):
        metas = [FrameMeta(s, seq, None, time.time(), time.monotonic(), 1.0, BOX) for s in ("f", "cam")]
        f, cam = detector.detect(engine.submit([None, None]).wait(), metas, t_submit=0.0, t_done=0.0)
    assert f.detections.track_ids.tolist() == [1] and f.analytics is not None
    assert cam.detections.track_ids.tolist() == [-1] and cam.analytics is None


class RefusingPublisher(MemoryPublisher):
    """As ZmqPublisher when a subscriber is at its HWM: every ``every``-th detection is missed by a subscriber."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self._every = every
        self._offered = 0

    def publish_detections(self, stream_id, payload) -> bool:
        self._offered += 1
        if self._offered % self._every == 0:
            self.dropped_hwm += 1
            return False
        return super().publish_detections(stream_id, payload)


def test_messages_a_subscriber_missed_at_its_hwm_reach_the_status_the_report_and_prometheus(caplog):
    run = Run(FixedEngine())
    run.publisher = publisher = RefusingPublisher(every=3)
    run.results._publisher = publisher  # the test's stand-in for a ZmqPublisher with a stalled subscriber
    run.put("f", 4)
    run.put("cam", 3)
    with caplog.at_level("WARNING", logger="app.stages.results"):
        run.run_to_end()
    snapshots = run.results.streams()
    report = RunReport(streams=snapshots, engine="fixed:test", elapsed_s=1.0)
    missed = {s: run.ledger.counts(s).dropped_by_reason.get(DropReason.SUBSCRIBER_HWM, 0) for s in run.handed_over}
    assert sum(missed.values()) == publisher.dropped_hwm == 2  # 7 detection messages, every third missed
    for stream, handed_over in run.handed_over.items():
        counts = run.ledger.counts(stream)
        assert counts.published + counts.dropped == handed_over, stream  # each frame counted once
        assert run.publisher.of(stream, "statuses")[-1]["dropped"] == counts.dropped == report.dropped[stream]
        assert run.prometheus("detstream_frames_dropped_total", stream=stream,
                              reason="subscriber_hwm") == missed[stream]
    warnings = [r.getMessage() for r in caplog.records if "high-water mark" in r.getMessage()]
    assert len(warnings) == 1 and "missed" in warnings[0], warnings
