"""The whole file pipeline through the CLI: real clips, the real default model, a plain pyzmq SUB."""

from __future__ import annotations

import signal
import time

import pytest

from app.publish.messages import validate_detection, validate_status
from tests.conftest import count_frames, detstream, start_detstream, stop_process


@pytest.mark.parametrize("clip_fixture", ["bikes", "vtest"])
def test_a_file_run_publishes_one_valid_message_per_decoded_frame(request, clip_fixture, default_model, collector,
                                                                 port):
    clip = request.getfixturevalue(clip_fixture)
    result = detstream("run", "--source", f"clip={clip}", "--publish", f"tcp://127.0.0.1:{port}",
                       "--max-batch", "4", "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    collector.stop()
    dets = collector.detections("clip")
    expected = count_frames(clip)
    assert [d["seq"] for d in dets] == list(range(expected))
    problems = [p for d in dets[:: max(1, len(dets) // 50)] for p in validate_detection(d)]
    assert not problems, problems[:5]
    for d in dets:
        assert d["dropped_before"] == 0
        for det in d["detections"]:
            x1, y1, x2, y2 = det["box"]
            assert 0 <= x1 < x2 <= d["width"] and 0 <= y1 < y2 <= d["height"]
    assert sum(len(d["detections"]) for d in dets) > len(dets), "the default model should find objects"
    statuses = collector.statuses("clip")
    assert all(not validate_status(s) for s in statuses)
    assert statuses[-1]["state"] == "ended"
    last_det_index = max(i for i, (t, _) in enumerate(collector.messages) if t.startswith("det/"))
    ended_index = max(i for i, (t, p) in enumerate(collector.messages) if t.startswith("status/")
                      and p["state"] == "ended")
    assert ended_index > last_det_index, "'ended' must follow the stream's last detection"


def test_annotate_writes_a_playable_video_with_every_frame_and_snapshots(bikes, default_model, tmp_path, port):
    out = tmp_path / "out"
    result = detstream("run", "--source", f"bikes={bikes}", "--publish", f"tcp://127.0.0.1:{port}",
                       "--annotate", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    video = out / "bikes.mp4"
    assert count_frames(video) == count_frames(bikes)
    import av

    with av.open(str(video)) as annotated, av.open(str(bikes)) as source:
        rates = [float(c.streams.video[0].average_rate) for c in (annotated, source)]
    assert rates[0] == pytest.approx(rates[1], rel=0.05), "the annotated video plays at the source's rate"
    snapshots = sorted(out.glob("bikes_*.jpg"))
    assert 1 <= len(snapshots) <= 5


@pytest.mark.parametrize(("make_source", "needle"), [
    (lambda tmp: tmp / "missing.mp4", "missing.mp4"),
    (lambda tmp: (tmp / "notes.mp4").write_text("this is not a video") and tmp / "notes.mp4", "notes.mp4"),
])
def test_a_bad_source_exits_non_zero_with_one_line_naming_it(tmp_path, default_model, port, make_source, needle):
    source = make_source(tmp_path)
    result = detstream("run", "--source", str(source), "--publish", f"tcp://127.0.0.1:{port}", "--no-progress",
                       timeout_s=60)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("detstream: error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr[-1500:]
    assert "Traceback" not in result.stderr


def test_a_model_that_is_not_onnx_exits_non_zero_with_one_clear_line(tmp_path, bikes, port):
    fake = tmp_path / "model.onnx"
    fake.write_text("not a model")
    result = detstream("run", "--source", str(bikes), "--model", str(fake), "--publish", f"tcp://127.0.0.1:{port}",
                       "--no-progress", timeout_s=60)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("detstream: error:")]
    assert len(errors) == 1 and "model.onnx" in errors[0], result.stderr[-1500:]
    assert "Traceback" not in result.stderr


def test_sigterm_mid_run_publishes_every_decoded_frame_then_exits_zero(vtest, default_model, collector, port):
    proc = start_detstream("run", "--source", f"v={vtest}", "--publish", f"tcp://127.0.0.1:{port}",
                           "--no-progress")
    deadline = time.monotonic() + 120
    while len(collector.detections("v")) < 30 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before the signal could be sent"
    sent = time.monotonic()
    code, _, err = stop_process(proc, signal.SIGTERM, timeout_s=15)
    assert code == 0, err[-2000:]
    assert time.monotonic() - sent < 5.0 + 1.0
    collector.stop()
    seqs = [d["seq"] for d in collector.detections("v")]
    assert seqs == list(range(len(seqs))) and len(seqs) < count_frames(vtest)
    assert collector.statuses("v")[-1]["state"] == "ended"
