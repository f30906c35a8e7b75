"""The annotation sink when writing fails: it stops, says so once, and never holds the postprocess thread."""

from __future__ import annotations

import errno
import logging
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest

from app.stages.annotate import AnnotateSink
from app.types import Detections, FrameMeta, FrameResult, Letterbox


def frame(seq: int, stream_id: str = "f") -> FrameResult:
    meta = FrameMeta(stream_id, seq, seq / 10, time.time(), time.monotonic(), 0.0, Letterbox(1.0, 0.0, 0.0, 64, 64),
                     image=np.full((48, 64, 3), seq % 255, np.uint8))
    return FrameResult(meta, Detections.empty(), 0.0, 0.0)


class FullDisk:
    """An MP4 container whose writes fail with ENOSPC after ``ok_packets`` packets, as on a disk that fills."""

    def __init__(self, path: Path, ok_packets: int) -> None:
        self._container = av.open(str(path), mode="w")
        self._ok = ok_packets
        self.closed = False

    def add_stream(self, *args, **kwargs):
        return self._container.add_stream(*args, **kwargs)

    def mux(self, packet) -> None:
        if self._ok <= 0:
            raise OSError(errno.ENOSPC, "No space left on device", "f.mp4")
        self._ok -= 1
        self._container.mux(packet)

    def close(self) -> None:
        self.closed = True
        self._container.close()


def submit_all(sink: AnnotateSink, frames: int, lossless: bool, timeout_s: float, pause_s: float = 0.0) -> bool:
    """Submit ``frames`` frames from another thread, as the postprocess thread would; True if all returned in time."""
    done = threading.Event()

    def postprocess() -> None:
        for seq in range(frames):
            sink.submit(frame(seq), lossless)
            time.sleep(pause_s)
        done.set()

    threading.Thread(target=postprocess, daemon=True).start()
    return done.wait(timeout_s)


@pytest.mark.parametrize("lossless", [True, False], ids=["file", "live"])
def test_a_sink_whose_disk_fills_stops_once_and_never_blocks_the_submitter(tmp_path, caplog, lossless):
    containers: list[FullDisk] = []

    def open_output(path: Path) -> FullDisk:
        containers.append(FullDisk(path, ok_packets=3))
        return containers[-1]

    sink = AnnotateSink(tmp_path, ("thing",), 0, lambda _sid: None, queue_size=2, open_output=open_output)
    sink.start()
    with caplog.at_level(logging.INFO, logger="app.stages.annotate"):
        pause_s = 0 if lossless else 0.005  # a live source: slow enough that frames reach the encoder
        assert submit_all(sink, 200, lossless, timeout_s=20, pause_s=pause_s), "submit blocked on a failed sink"
        sink.close(timeout_s=5)
    assert sink.failure is not None and "ENOSPC" in sink.failure and "f.mp4" in sink.failure
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "sink annotate failed" in warnings[0].getMessage() and "No space left on device" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records), "no traceback for an expected write error"
    assert containers and all(c.closed for c in containers), "the files it had open are closed"
    assert sink.dropped > 0


def test_a_failed_sink_drops_later_frames_at_once(tmp_path):
    def open_output(path: Path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    sink = AnnotateSink(tmp_path, ("thing",), 0, lambda _sid: None, queue_size=1, open_output=open_output)
    sink.start()
    sink.submit(frame(0), lossless=True)
    deadline = time.monotonic() + 5
    while sink.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink.failure is not None
    started = time.monotonic()
    for seq in range(1, 101):
        sink.submit(frame(seq), lossless=True)
    assert time.monotonic() - started < 0.5
    sink.close(timeout_s=5)
    assert sink.dropped == 101  # the frame that failed, and every one after it


def test_a_healthy_sink_keeps_every_frame_of_a_file(tmp_path):
    sink = AnnotateSink(tmp_path, ("thing",), 0, lambda _sid: None, queue_size=2)
    sink.start()
    assert submit_all(sink, 30, lossless=True, timeout_s=20)
    sink.close(timeout_s=10)
    assert sink.failure is None and sink.dropped == 0
    with av.open(str(tmp_path / "f.mp4")) as video:
        assert sum(1 for _ in video.decode(video=0)) == 30
