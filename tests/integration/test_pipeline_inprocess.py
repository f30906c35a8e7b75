"""The pipeline in-process: an engine failure on one batch, and steady state without allocation growth."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from app.config import parse_config
from app.pipeline import Pipeline
from app.types import FLOAT_CHW, UINT8_HWC, FrameFormat
from tests.conftest import Collector, free_port
from tests.fakes import FixedEngine, MemoryPublisher, MemorySink


def _config(clip: Path, port: int, **source):
    return parse_config({"sources": [{"id": "s", "url": str(clip), **source}],
                         "engine": {"max_batch": 4, "max_wait_ms": 2},
                         "publish": {"endpoint": f"tcp://127.0.0.1:{port}", "startup_wait_s": 1.0}})


def test_an_engine_error_on_one_batch_costs_those_frames_and_the_run_goes_on(small_clip):
    port = free_port()
    collector = Collector(f"tcp://127.0.0.1:{port}").start()
    engine = FixedEngine(fail_on_call=3)
    pipeline = Pipeline(_config(small_clip, port), engine=engine)
    pipeline.start()
    assert pipeline.wait(60)
    pipeline.close()
    collector.stop()
    seqs = [d["seq"] for d in collector.detections("s")]
    lost = sorted(set(range(40)) - set(seqs))
    assert 1 <= len(lost) <= 4 and lost == list(range(lost[0], lost[0] + len(lost)))
    after_gap = next(d for d in collector.detections("s") if d["seq"] == lost[-1] + 1)
    assert after_gap["dropped_before"] == len(lost)
    final = collector.statuses("s")[-1]
    assert final["state"] == "ended" and final["dropped"] == len(lost)
    assert pipeline.metrics.engine_failures._value.get() == 1
    dropped = pipeline.metrics.frames_dropped
    assert dropped.labels(stream="s", reason="engine_error")._value.get() == len(lost)
    assert dropped.labels(stream="s", reason="live_policy")._value.get() == 0  # counted once, under its own reason


def test_a_publisher_and_a_second_sink_passed_in_receive_every_frame(small_clip):
    publisher, sink = MemoryPublisher(), MemorySink()
    pipeline = Pipeline(_config(small_clip, free_port()), engine=FixedEngine(), publisher=publisher, sinks=[sink])
    pipeline.start()
    try:
        assert pipeline.wait(60)
    finally:
        pipeline.close()
    assert [d["seq"] for d in publisher.of("s")] == list(range(40))
    assert [r.meta.seq for r in sink.results] == list(range(40)) and all(sink.lossless)
    assert sink.started.is_set() and sink.closed and publisher.closed
    assert publisher.of("s", "statuses")[-1]["state"] == "ended"
    report = pipeline.report()
    assert report.published == {"s": 40} and report.dropped == {"s": 0} and not report.failed


class _SeeingEngine(FixedEngine):
    """FixedEngine that keeps the shape, dtype and mean of every frame it is given, in ``frame_format``."""

    def __init__(self, frame_format: FrameFormat) -> None:
        super().__init__()
        self.frame_format = frame_format
        self.seen: list[tuple[tuple[int, ...], str, float]] = []

    def submit(self, frames):
        self.seen += [(frame.shape, str(frame.dtype), float(frame.mean())) for frame in frames]
        return super().submit(frames)


@pytest.mark.parametrize(("frame_format", "ring"), [
    (FLOAT_CHW, "8 slots of 3x64x64 float32 (4 per stream), 0.4 MiB"),
    (UINT8_HWC, "8 slots of 64x64x3 uint8 (4 per stream), 0.1 MiB"),
])
def test_the_ring_holds_frames_as_the_engine_reads_them_and_the_log_says_its_size(small_clip, caplog, frame_format,
                                                                                  ring):
    import logging

    port = free_port()
    config = parse_config({"sources": [{"id": "a", "url": str(small_clip)}, {"id": "b", "url": str(small_clip)}],
                           "engine": {"max_batch": 4, "max_wait_ms": 2},
                           "publish": {"endpoint": f"tcp://127.0.0.1:{port}", "startup_wait_s": 0}})
    caplog.set_level(logging.INFO, logger="app.pipeline")
    engine = _SeeingEngine(frame_format)
    pipeline = Pipeline(config, engine=engine)
    pipeline.start()
    try:
        assert pipeline.wait(60)
    finally:
        pipeline.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("frame ring:")]
    # two streams, batches of up to 4: two batches' worth, 4 slots per stream, of 64 x 64 pixels each
    assert lines == [f"frame ring: {ring}, pageable (resident once used)"]
    assert len(engine.seen) == 80  # 40 frames per stream
    shapes = {(shape, dtype) for shape, dtype, _ in engine.seen}
    assert shapes == {(frame_format.shape(64, 64), frame_format.dtype)}
    scale = 255 if frame_format is FLOAT_CHW else 1  # pixels as they are, or scaled by 1/255
    assert all(0 < mean * scale < 255 for _, _, mean in engine.seen)  # a picture, not an empty slot


def test_steady_state_allocates_nothing_that_grows_with_frames(small_clip):
    port = free_port()
    pipeline = Pipeline(_config(small_clip, port, loop=True), engine=FixedEngine())
    pipeline.start()

    def published() -> int:
        return pipeline.streams()["s"].published

    def wait_for(frames: int) -> None:
        deadline = time.monotonic() + 60
        while published() < frames and time.monotonic() < deadline:
            time.sleep(0.02)
        assert published() >= frames

    try:
        wait_for(100)
        tracemalloc.start(5)
        wait_for(published() + 50)
        before = tracemalloc.take_snapshot()
        wait_for(published() + 300)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        pipeline.stop()
        pipeline.wait(10)
        pipeline.close()
    app_only = [tracemalloc.Filter(True, "*/app/*")]
    growth = after.filter_traces(app_only).compare_to(before.filter_traces(app_only), "lineno")
    grown = sum(stat.size_diff for stat in growth if stat.size_diff > 0)
    assert grown < 64 * 1024, "\n".join(str(s) for s in growth[:8])


def test_live_cameras_beyond_the_engine_get_one_warning_that_says_why(small_clip, default_model, caplog,
                                                                      monkeypatch):
    """Six 25-fps cameras (150 frames/s) against yolov3-tiny on this CPU (~45 frames/s): the real overload."""
    import logging

    from app.stages import overload

    monkeypatch.setattr(overload, "SETTLE_S", 2.0)
    port = free_port()
    cams = [f"cam{i}" for i in range(6)]
    config = parse_config({"sources": [{"id": cam, "url": str(small_clip), "realtime": True, "loop": True}
                                       for cam in cams],
                           # ONNX Runtime's CPU workers: they measure each frame's inference CPU, which the line names
                           "engine": {"backend": "onnxruntime"},
                           "publish": {"endpoint": f"tcp://127.0.0.1:{port}", "startup_wait_s": 0}})
    caplog.set_level(logging.WARNING, logger="app.stages.results")
    pipeline = Pipeline(config, models_dir=default_model.parent)
    pipeline.start()
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not _overload_lines(caplog):
            time.sleep(0.2)
    finally:
        pipeline.stop()
        pipeline.wait(20)
        pipeline.close()
    lines = _overload_lines(caplog)
    assert len(lines) == 1, lines  # once, however long it lasts (the next one waits a minute)
    text = lines[0]
    assert all(f"{cam} " in text for cam in cams), text  # drops are spread over every camera
    published = float(text.split("It published ")[1].split(" frames/s")[0])
    assert 5 < published < 150, text  # what the engine kept up with, below what the cameras offered
    dropped = int(text.split("dropped ")[1].split(" frames")[0])
    counted = sum(pipeline.metrics.frames_dropped.labels(stream=cam, reason="live_policy")._value.get() for cam in cams)
    assert 0 < dropped <= counted
    assert "onnxruntime:CPUExecutionProvider:fp32" in text and "max_fps" in text
    offered = float(text.split("They offered ")[1].split(" frames/s")[0])
    assert offered > published, text  # six 25-fps cameras ask for up to 150 frames/s
    cpu_ms = float(text.split("a frame ")[1].split(" ms of inference CPU")[0])
    assert 5 < cpu_ms < 500, text  # yolov3-tiny fp32 on one core: tens of ms


def _overload_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("live sources dropped")]
