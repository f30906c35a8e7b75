"""PyAVSource on real files made with ffmpeg, feeding a real Batcher over a real FrameRing."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from app.config import SourceConfig
from app.preprocess import PAD_VALUE
from app.sources import create_source
from app.sources.base import SourceState
from tests.integration.rtsp import DrainedBatcher, StatusLog, make_clip

INPUT_HW = (128, 128)  # a 320x240 frame fits as 128x96 with 16 rows of padding above and below


def run_source(config: SourceConfig, sink: DrainedBatcher, log: StatusLog, timeout_s: float = 20, **kwargs):
    """Decode ``config`` into ``sink`` to its end; the model input is the sink's own slot size."""
    source = create_source(config, sink, log, input_hw=tuple(sink.ring.buffer.shape[2:]), **kwargs)
    source.start()
    assert source.join(timeout_s), f"{config.id} did not end within {timeout_s} s"
    assert sink.wait_ended(config.id, 5)
    return source


def test_with_rect_a_4_by_3_clip_fills_a_96_row_view_of_each_128_square_slot(h264_clip):
    shapes: list[tuple[int, ...]] = []
    sink = DrainedBatcher(["rect"], live=False, input_hw=INPUT_HW, inspect=lambda slot: shapes.append(slot.array.shape))
    try:
        run_source(SourceConfig(id="rect", url=str(h264_clip)), sink, StatusLog(), rect=True, stride=32)
    finally:
        sink.close()
    box = sink.received["rect"][0].meta.letterbox
    assert len(shapes) == 60 and set(shapes) == {(3, 96, 128)}  # 320x240 scaled by 0.4 is 128x96: no padding
    assert (box.scale, box.pad_x, box.pad_y) == (0.4, 0, 0)


def test_every_frame_of_a_60_frame_clip_arrives_in_order_with_its_letterbox(h264_clip):
    pads: list[float] = []
    sink = DrainedBatcher(["clip"], live=False, input_hw=INPUT_HW,
                          inspect=lambda slot: pads.append(float(slot.array[0, 0, 0])))
    log = StatusLog()
    try:
        source = run_source(SourceConfig(id="clip", url=str(h264_clip)), sink, log, keep_image=True)
    finally:
        sink.close()
    received = sink.received["clip"]
    assert [r.meta.seq for r in received] == list(range(60))
    assert source.total_frames == 60
    box = received[0].meta.letterbox
    assert (box.scale, box.pad_x, box.pad_y, box.src_width, box.src_height) == (0.4, 0, 16, 320, 240)
    assert pads and all(p == pytest.approx(PAD_VALUE / 255) for p in pads)
    assert received[0].meta.image.shape == (240, 320, 3)
    assert [r.meta.pts_s for r in received[:3]] == pytest.approx([0.0, 0.1, 0.2])
    assert all(r.meta.decode_ms > 0 for r in received)
    assert log.states() == [SourceState.CONNECTING, SourceState.RUNNING, SourceState.ENDED]
    assert log.statuses[-1].frames == 60
    assert sink.close_calls["clip"] == 1


def test_the_decoder_thread_is_named_after_the_source(h264_clip):
    sink = DrainedBatcher(["named"], live=False, consume_s=0.05)
    source = create_source(SourceConfig(id="named", url=str(h264_clip)), sink, StatusLog(), input_hw=(96, 128))
    try:
        source.start()
        assert "detstream.decode.named" in [t.name for t in threading.enumerate()]
    finally:
        source.stop()
        assert source.join(2)
        sink.close()


def test_loop_restarts_the_file_and_seq_continues_across_three_passes(h264_clip):
    sink = DrainedBatcher(["loop"], live=False)
    log = StatusLog()
    source = create_source(SourceConfig(id="loop", url=str(h264_clip), loop=True), sink, log, input_hw=(96, 128))
    source.start()
    try:
        assert sink.wait_count("loop", 180, timeout_s=20)
    finally:
        source.stop()
        assert source.join(2)
        sink.wait_ended("loop", 5)
        sink.close()
    received = sink.received["loop"]
    assert [r.meta.seq for r in received] == list(range(len(received)))
    restarts = sum(1 for a, b in itertools.pairwise(received) if b.meta.pts_s < a.meta.pts_s)
    assert restarts >= 2
    assert log.statuses[-1].state is SourceState.ENDED and log.statuses[-1].reason == "stopped"
    assert source.total_frames is None
    assert sink.close_calls["loop"] == 1


def test_realtime_holds_the_clip_frame_rate_within_5_percent(h264_clip):
    sink = DrainedBatcher(["rt"], live=True)
    log = StatusLog()
    source = create_source(SourceConfig(id="rt", url=str(h264_clip), realtime=True), sink, log, input_hw=(96, 128))
    source.start()
    try:
        assert sink.wait_count("rt", 21, timeout_s=10)
    finally:
        source.stop()
        source.join(2)
        sink.close()
    captured = [r.meta.t_captured for r in sink.received["rt"][:21]]
    fps = 20 / (captured[-1] - captured[0])
    assert fps == pytest.approx(10.0, rel=0.05)


def test_max_fps_halves_a_10_fps_clip_to_5_fps(h264_clip):
    sink = DrainedBatcher(["dec"], live=False)
    log = StatusLog()
    try:
        source = run_source(SourceConfig(id="dec", url=str(h264_clip), max_fps=5), sink, log)
    finally:
        sink.close()
    received = sink.received["dec"]
    assert [r.meta.seq for r in received] == list(range(len(received)))
    pts = [r.meta.pts_s for r in received]
    fps = (len(pts) - 1) / (pts[-1] - pts[0])
    assert fps == pytest.approx(5.0, abs=0.5)
    assert source.total_frames == 30


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Broken inputs and a fragment the failure reason must contain."""
    root = tmp_path_factory.mktemp("bad")
    good_moov_last = make_clip(root / "moov_last.mp4", frames=60, faststart=False)
    good_moov_first = make_clip(root / "moov_first.mp4", frames=60, faststart=True)
    (root / "cut_head.mp4").write_bytes(good_moov_last.read_bytes()[: good_moov_last.stat().st_size // 2])
    (root / "cut_tail.mp4").write_bytes(good_moov_first.read_bytes()[: good_moov_first.stat().st_size // 2])
    (root / "notes.txt").write_text("this is not a video\n" * 20)
    (root / "empty.mp4").write_bytes(b"")
    (root / "a_directory").mkdir()
    return {
        "missing": (root / "vtest.avi", "vtest.avi: no such file"),
        "directory": (root / "a_directory", "a_directory: is a directory"),
        "text": (root / "notes.txt", "notes.txt: not a video"),
        "empty": (root / "empty.mp4", "empty.mp4: empty file"),
        "cut_head": (root / "cut_head.mp4", "cut_head.mp4: not a video"),
        "cut_tail": (root / "cut_tail.mp4", "cut_tail.mp4: truncated"),
    }


def test_broken_files_fail_with_a_one_line_reason_and_other_sources_are_unaffected(bad_files, h264_clip):
    ids = [*bad_files, "good"]
    sink = DrainedBatcher(ids, live=False, slots=12, quota=2)
    logs = {stream_id: StatusLog() for stream_id in ids}
    configs = [SourceConfig(id=k, url=str(path)) for k, (path, _) in bad_files.items()]
    configs.append(SourceConfig(id="good", url=str(h264_clip)))
    sources = [create_source(c, sink, logs[c.id], input_hw=(96, 128)) for c in configs]
    for source in sources:
        source.start()
    try:
        for source in sources:
            assert source.join(20)
        for stream_id in ids:
            assert sink.wait_ended(stream_id, 5)
    finally:
        sink.close()
    assert sink.seqs("good") == list(range(60))
    assert logs["good"].statuses[-1].state is SourceState.ENDED
    for stream_id, (_, fragment) in bad_files.items():
        terminal = logs[stream_id].statuses[-1]
        assert terminal.state is SourceState.FAILED, (stream_id, terminal)
        assert fragment in terminal.reason and "\n" not in terminal.reason, (stream_id, terminal.reason)
        assert [s.state.terminal for s in logs[stream_id].statuses].count(True) == 1
        assert sink.close_calls[stream_id] == 1
    decodable = sink.seqs("cut_tail")
    assert 0 < len(decodable) < 60 and decodable == list(range(len(decodable)))


def test_a_file_source_never_drops_when_the_sink_is_slow(h264_clip):
    sink = DrainedBatcher(["slow"], live=False, slots=4, quota=2, consume_s=0.01)
    log = StatusLog()
    try:
        run_source(SourceConfig(id="slow", url=str(h264_clip)), sink, log, timeout_s=30)
    finally:
        sink.close()
    assert sink.seqs("slow") == list(range(60))
    assert sink.dropped("slow") == 0
    assert all(r.meta.dropped_before == 0 for r in sink.received["slow"])


def test_stop_ends_a_file_source_promptly_with_one_terminal_status(h264_clip):
    sink = DrainedBatcher(["stop"], live=False, slots=2, quota=1, consume_s=0.2)
    log = StatusLog()
    source = create_source(SourceConfig(id="stop", url=str(h264_clip)), sink, log, input_hw=(96, 128))
    source.start()
    try:
        assert sink.wait_count("stop", 2, timeout_s=5)
        started = time.monotonic()
        source.stop()
        source.stop()  # idempotent
        assert source.join(1.0)
        assert time.monotonic() - started < 1.0
    finally:
        sink.close()
    terminal = [s for s in log.statuses if s.state.terminal]
    assert len(terminal) == 1 and terminal[0].state is SourceState.ENDED and terminal[0].reason == "stopped"
    assert sink.close_calls["stop"] == 1
    assert np.all(np.diff(sink.seqs("stop")) == 1)


def test_a_mid_stream_resolution_change_letterboxes_each_frame_by_its_own_size(tmp_path):
    small = make_clip(tmp_path / "small.ts", frames=20, size="320x240")
    large = make_clip(tmp_path / "large.ts", frames=20, size="640x360")
    joined = tmp_path / "joined.ts"  # MPEG-TS concatenates byte-wise; the second SPS switches the size
    joined.write_bytes(small.read_bytes() + large.read_bytes())
    sink = DrainedBatcher(["switch"], live=False, input_hw=INPUT_HW)
    try:
        run_source(SourceConfig(id="switch", url=str(joined)), sink, StatusLog())
    finally:
        sink.close()
    boxes = [r.meta.letterbox for r in sink.received["switch"]]
    sizes = [(b.src_width, b.src_height) for b in boxes]
    assert sizes[0] == (320, 240) and sizes[-1] == (640, 360)
    assert sizes == sorted(sizes), "one switch, no flapping"
    assert boxes[-1].scale == pytest.approx(0.2) and boxes[-1].pad_y == 28


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        return


def test_an_hls_playlist_over_http_delivers_every_frame_then_is_reopened(tmp_path):
    clip = make_clip(tmp_path / "src.mp4", frames=40)
    hls = tmp_path / "hls"
    hls.mkdir()
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(clip), "-c", "copy", "-f", "hls", "-hls_time", "1",
                    "-hls_playlist_type", "vod", str(hls / "index.m3u8")], check=True, timeout=60)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(hls)))
    threading.Thread(target=server.serve_forever, name="test.http", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.m3u8"
    sink = DrainedBatcher(["hls"], live=False)
    log = StatusLog()
    source = create_source(SourceConfig(id="hls", url=url, mode="file"), sink, log, input_hw=(96, 128))
    source.start()
    try:
        assert sink.wait_count("hls", 40, timeout_s=20)
        assert log.wait_state(SourceState.RECONNECTING, 10) is not None
    finally:
        source.stop()
        assert source.join(2)
        sink.close()
        server.shutdown()
        server.server_close()
    first_pass = sink.received["hls"][:40]
    assert [r.meta.seq for r in first_pass] == list(range(40))
    reopened = next(s for s in log.statuses if s.state is SourceState.RECONNECTING)
    assert reopened.error_kind == "eof" and reopened.frames == 40
