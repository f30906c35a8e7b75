"""Shutdown is a feature: SIGINT/SIGTERM drain and publish everything, a second signal exits at once.

``tests/integration/test_file_pipeline.py`` already sends SIGTERM to a file
run; this extends it: SIGINT on files, both signals on live RTSP (with a
camera that hangs), a signal during start-up, the second signal, and an
in-process check that every frame a decoder handed over before the stop is
published (compared with the decoder's own count).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.config import parse_config
from app.pipeline import Pipeline
from tests.conftest import Collector, free_port, start_detstream, stop_process, wait_until
from tests.fakes import FixedEngine
from tests.integration.rtsp import make_clip

EXIT_WITHIN_S = 5.0
FORCED_WITHIN_S = 1.0



def signal_and_time(proc: subprocess.Popen, sig: int, timeout_s: float = 20) -> tuple[int, float, str]:
    """Send ``sig``; (exit code, seconds until exit, stderr). The process is always ended."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    finally:
        code, _, err = stop_process(proc, signal.SIGKILL, timeout_s=5)
    return code, time.monotonic() - sent, err


def published_after_start(collector: Collector, streams: list[str], frames: int, timeout_s: float = 120) -> bool:
    return wait_until(lambda: all(len(collector.detections(s)) >= frames for s in streams), timeout_s, 0.1)


def assert_drained(collector: Collector, stream: str, *, lossless: bool) -> None:
    """Seqs 0..last (file) or gaps equal to dropped_before (live); the final status is 'ended: stopped'."""
    dets = collector.detections(stream)
    seqs = [d["seq"] for d in dets]
    assert seqs, f"{stream}: nothing published"
    assert seqs[0] == dets[0]["dropped_before"], f"{stream}: the first seq {seqs[0]} is not explained"
    if lossless:
        assert seqs == list(range(len(seqs))), f"{stream}: lost frames in the drain"
    for previous, current in itertools.pairwise(dets):
        assert current["seq"] - previous["seq"] - 1 == current["dropped_before"], stream
    final = collector.statuses(stream)[-1]
    assert (final["state"], final["reason"]) == ("ended", "stopped"), final
    assert final["frames"] == seqs[-1] + 1
    messages = collector.messages
    last_det = max(i for i, (t, _) in enumerate(messages) if t == f"det/{stream}/")
    ended = next(i for i, (t, p) in enumerate(messages) if t == f"status/{stream}/" and p["state"] == "ended")
    assert ended > last_det, f"{stream}: 'ended' came before the last detection"


@pytest.fixture(scope="module")
def long_clips(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("shutdown")
    return [make_clip(root / f"long{i}.mp4", frames=400, fps=25) for i in range(2)]


def run_args(port: int, *sources: str, extra: tuple[str, ...] = ()) -> list[str]:
    args = ["run", "--publish", f"tcp://127.0.0.1:{port}", "--max-batch", "4", "--no-progress", *extra]
    for source in sources:
        args += ["--source", source]
    return args


# -- file mode ---------------------------------------------------------------------------------------------------

def test_sigint_mid_file_run_drains_every_decoded_frame_and_exits_0_within_5_s(long_clips, default_model, collector,
                                                                              port):
    proc = start_detstream(*run_args(port, f"a={long_clips[0]}", f"b={long_clips[1]}"))
    try:
        assert published_after_start(collector, ["a", "b"], 20), "the run did not get going"
    finally:
        code, took, err = signal_and_time(proc, signal.SIGINT)
    collector.stop()
    assert code == 0, err[-2000:]
    assert took < EXIT_WITHIN_S, f"took {took:.1f} s"
    assert "Traceback" not in err
    for stream in ("a", "b"):
        assert_drained(collector, stream, lossless=True)
        assert len(collector.detections(stream)) < 400, "the signal came too late to test a drain"


class LoggedRun:
    """``detstream run`` whose stderr lines are collected as they come (to act on a log line)."""

    def __init__(self, *args: str) -> None:
        self.proc = start_detstream(*args)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="test.stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, timeout_s: float) -> int | None:
        """Index of the first stderr line matching ``pattern``, or None after the timeout (or exit)."""
        found = lambda: next((i for i, line in enumerate(self.lines) if re.search(pattern, line)), None)  # noqa: E731
        wait_until(lambda: found() is not None or self.proc.poll() is not None, timeout_s, 0.01)
        return found()

    def signal_and_wait(self, sig: int, timeout_s: float = 30) -> tuple[int, float]:
        sent = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        took = time.monotonic() - sent
        self._reader.join(5)
        self.proc.stdout.close()
        return self.proc.returncode, took


def test_a_signal_during_start_up_still_exits_0_within_5_s(long_clips, default_model, collector, port):
    run = LoggedRun(*run_args(port, f"a={long_clips[0]}", f"b={long_clips[1]}"))
    try:
        assert run.wait_for_line(r"publishing on tcp://", 60) is not None, run.lines[-5:]
    finally:
        code, took = run.signal_and_wait(signal.SIGTERM, timeout_s=EXIT_WITHIN_S + 2)
    collector.stop()
    stopping = run.wait_for_line(r"SIGTERM: stopping", 0)
    loaded = run.wait_for_line(r"app\.pipeline: model ", 0)
    assert stopping is not None and (loaded is None or stopping < loaded), "the signal came after start-up"
    assert code == 0, run.lines[-10:]
    assert took < EXIT_WITHIN_S, f"a SIGTERM while the model loaded took {took:.1f} s to end the run"
    assert not any("Traceback" in line for line in run.lines)
    for stream in ("a", "b"):
        final = collector.statuses(stream)[-1:]
        assert final and final[0]["state"] == "ended", f"{stream}: no final status"


HANDLED_WITHIN_S = 0.3  # the interpreter's own start, then the first import of app/__main__.py


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (``SigCgt`` of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("delay_s", [0.05, 0.2, 0.5, 1.0])
def test_sigterm_at_any_moment_of_start_up_exits_0(delay_s, long_clips, default_model, collector, port):
    """From the first import on: config, logging, model load; statuses are published once the socket is bound.

    No process can catch a signal before its interpreter runs, so the signal goes at ``delay_s`` after the
    start or when the handler is in place, whichever is later; the handler must be in place within
    HANDLED_WITHIN_S (before any configuration is read).
    """
    started = time.monotonic()
    run = LoggedRun(*run_args(port, f"a={long_clips[0]}"))
    assert wait_until(lambda: catches_sigterm(run.proc.pid), HANDLED_WITHIN_S, 0.001), \
        f"no SIGTERM handler {HANDLED_WITHIN_S} s after the start"
    time.sleep(max(0.0, started + delay_s - time.monotonic()))
    code, took = run.signal_and_wait(signal.SIGTERM, timeout_s=EXIT_WITHIN_S + 5)
    collector.stop()
    assert code == 0, (code, run.lines[-10:])
    assert took < EXIT_WITHIN_S + 5, f"took {took:.1f} s"
    assert not any("Traceback" in line for line in run.lines), run.lines
    if run.wait_for_line(r"publishing on tcp://", 0) is not None:
        final = collector.statuses("a")[-1:]
        assert final and final[0]["state"] == "ended", "bound, but no final status"


# -- live mode ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_live_run_with_a_hung_camera_exits_0_within_5_s_with_final_statuses(
        sig, rtsp_server, long_clips, default_model, collector, port):
    cams = rtsp_server({"/a": "pattern:320x240@10", "/b": "pattern:320x240@10"})
    hung = rtsp_server({"/h": "pattern:320x240@10"})
    proc = start_detstream(*run_args(port, f"a={cams.url('/a')}", f"b={cams.url('/b')}", f"h={hung.url('/h')}",
                                     f"f={long_clips[0]}", extra=("--loop", "--realtime")))
    try:
        assert published_after_start(collector, ["a", "b", "h", "f"], 5), "not every source got going"
        hung.pause()  # SIGSTOP: its decoder now waits on a socket that will never deliver
        time.sleep(1.0)
    finally:
        code, took, err = signal_and_time(proc, sig)
        hung.resume()
    collector.stop()
    assert code == 0, err[-2000:]
    assert took < EXIT_WITHIN_S, f"took {took:.1f} s"
    assert "Traceback" not in err
    for stream in ("a", "b", "h", "f"):
        assert_drained(collector, stream, lossless=False)


# -- the second signal -------------------------------------------------------------------------------------------

def test_a_second_signal_exits_130_within_a_second_while_the_drain_is_slow(rtsp_server, long_clips, default_model,
                                                                         port):
    """The drain is made slow on purpose: a subscriber that never reads (the publisher lingers on close), sixteen
    file streams filling the ring on ONNX Runtime's fp32 CPU path (the default engine would drain the ring too fast
    for a second signal to find it busy), and a camera whose server is SIGSTOPped."""
    import zmq

    hung = rtsp_server({"/h": "pattern:320x240@10"})
    files = [f"f{i}={long_clips[i % 2]}" for i in range(16)]
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as deaf:
        deaf.rcvhwm = 1
        deaf.linger = 0
        deaf.subscribe(b"")
        deaf.connect(f"tcp://127.0.0.1:{port}")
        reader = Collector(f"tcp://127.0.0.1:{port}").start()
        proc = start_detstream(*run_args(port, *files, f"h={hung.url('/h')}",
                                         extra=("--engine", "onnxruntime", "--precision", "fp32")))
        try:
            assert published_after_start(reader, ["h"], 3), "the camera did not get going"
            reader.stop(settle_s=0)  # only the deaf subscriber is left
            hung.pause()
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            assert proc.poll() is None, "the drain finished before the second signal: nothing to force"
            code, took, err = signal_and_time(proc, signal.SIGINT)
        finally:
            hung.resume()
            stop_process(proc, signal.SIGKILL, timeout_s=5)
    assert code == 130, err[-2000:]
    assert took < FORCED_WITHIN_S, f"the second signal took {took:.2f} s"
    assert "second signal: exiting now" in err


# -- in-process: the decoder's own count against what was published ---------------------------------------------

class SlowEngine(FixedEngine):
    """FixedEngine that takes 15 ms per batch, so frames are waiting in the ring when the stop comes."""

    def submit(self, frames):
        time.sleep(0.015)
        return super().submit(frames)


def test_every_frame_a_decoder_handed_over_before_stop_is_published(tmp_path):
    clips = [make_clip(tmp_path / f"c{i}.mp4", frames=300, fps=25, size="160x120") for i in range(3)]
    port = free_port()
    collector = Collector(f"tcp://127.0.0.1:{port}").start()
    config = parse_config({"sources": [{"id": f"s{i}", "url": str(c)} for i, c in enumerate(clips)],
                           "engine": {"max_batch": 4, "max_wait_ms": 2},
                           "publish": {"endpoint": f"tcp://127.0.0.1:{port}", "startup_wait_s": 1.0}})
    pipeline = Pipeline(config, engine=SlowEngine())
    pipeline.start()
    try:
        assert wait_until(lambda: all(s.published >= 30 for s in pipeline.streams().values()), 30)
        pipeline.stop()
        assert pipeline.wait(10), "the drain did not finish"
    finally:
        pipeline.force_stop()
        pipeline.close()
        collector.stop()
    for source in pipeline.sources:
        handed_over = source.frames
        seqs = [d["seq"] for d in collector.detections(source.stream_id)]
        assert 30 <= handed_over < 300
        assert seqs == list(range(handed_over)), f"{source.stream_id}: decoded {handed_over}, published {len(seqs)}"
        assert collector.statuses(source.stream_id)[-1]["state"] == "ended"
