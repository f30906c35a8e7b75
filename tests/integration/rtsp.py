"""Helpers for source integration tests: the real GStreamer RTSP server, a garbage server, clips, sinks.

The RTSP server is ``scripts/rtsp_server.py`` run by the Debian python
(``/usr/bin/python3``, which has ``gi`` and GstRtspServer); it binds
127.0.0.1 only. Every wait here is bounded by a deadline.
"""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from app.batcher import Batcher
from app.ring import FrameRing, Slot
from app.sources.base import SourceState, SourceStatus
from app.types import FrameMeta

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
SERVER_SCRIPT = ROOT / "scripts" / "rtsp_server.py"


def gst_rtsp_missing() -> str | None:
    """Why the RTSP server cannot run here, or None when it can."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} not found"
    probe = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import Gst, GstRtspServer")
    result = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"{SYSTEM_PYTHON} lacks gi/GstRtspServer (apt: python3-gi gir1.2-gst-rtsp-server-1.0): " \
               f"{result.stderr.strip().splitlines()[-1:]}"
    return None


def make_clip(path: Path, frames: int = 60, fps: int = 10, size: str = "320x240", *, faststart: bool = True,
              gop: int = 10) -> Path:
    """An H.264 MP4 test clip made with ffmpeg (no B-frames, so RTP can carry it as is)."""
    cmd = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc=size={size}:rate={fps}",
           "-frames:v", str(frames), "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
           "-g", str(gop), "-bf", "0"]
    if faststart:
        cmd += ["-movflags", "+faststart"]
    subprocess.run([*cmd, str(path)], check=True, capture_output=True, timeout=60)
    return path


class RtspServer:
    """One ``scripts/rtsp_server.py`` process; ``restart()`` comes back on the same port."""

    def __init__(self, mounts: dict[str, str], *, user: str | None = None, password: str | None = None,
                 loop: bool = False, ready_timeout_s: float = 15.0) -> None:
        self.mounts = mounts
        self.user, self.password, self.loop = user, password, loop
        self.ready_timeout_s = ready_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log: list[str] = []

    def start(self) -> RtspServer:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:  # after kill() the old listening port may take a moment to be free again
            try:
                self._spawn()
                return self
            except RuntimeError:
                if self.port == 0 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _spawn(self) -> None:
        cmd = [SYSTEM_PYTHON, str(SERVER_SCRIPT), "--port", str(self.port)]
        for path, source in self.mounts.items():
            cmd += ["--mount", f"{path}={source}"]
        if self.user:
            cmd += ["--user", self.user, "--password", self.password or ""]
        if self.loop:
            cmd.append("--loop")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        line = self._read_ready()
        self.port = int(line.split("port=")[1])

    def _read_ready(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.log.append(line.rstrip())
                if line.startswith("READY port="):
                    threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
                    return line.strip()
        self.kill()
        raise RuntimeError(f"rtsp_server.py not ready in {self.ready_timeout_s} s: {self.log[-5:]}")

    def _drain(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.log.append(line.rstrip())

    def url(self, mount: str, user: str | None = None, password: str | None = None) -> str:
        auth = ""
        if user is not None:
            auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "") + "@"
        return f"rtsp://{auth}127.0.0.1:{self.port}{mount}"

    def kill(self) -> None:
        """SIGKILL, like a crashed camera: connections drop without a TEARDOWN."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> RtspServer:
        self.kill()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: the sockets stay open but nothing is sent (a hung camera)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)


class LoopbackPeer:
    """A TCP server on 127.0.0.1 whose accept loop runs on a daemon thread; ``handle(conn)`` is the subclass's."""

    thread_name = "test.peer"

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=self.thread_name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def url(self, path: str = "/cam") -> str:
        return f"rtsp://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


class GarbageServer(LoopbackPeer):
    """Accepts TCP connections and answers anything with bytes that are not RTSP."""

    thread_name = "test.garbage"

    def __init__(self, reply: bytes = b"\x00\xffNOT RTSP AT ALL\r\n\r\n" * 8) -> None:
        self.reply = reply
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(4096)
                conn.sendall(self.reply)
            except OSError:
                return


def dead_port() -> int:
    """A loopback port with nothing listening (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StatusLog:
    """Records every SourceStatus; the ``on_status`` of the source under test."""

    statuses: list[SourceStatus] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, status: SourceStatus) -> None:
        with self.changed:
            self.statuses.append(status)
            self.changed.notify_all()

    def states(self) -> list[SourceState]:
        return [s.state for s in self.statuses]

    def wait_for(self, predicate, timeout_s: float) -> SourceStatus | None:
        """The first status (from now on, or already seen) matching ``predicate``, or None after the timeout."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                for status in self.statuses:
                    if predicate(status):
                        return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.changed.wait(remaining)

    def wait_state(self, state: SourceState, timeout_s: float, after: int = 0) -> SourceStatus | None:
        return self.wait_for(lambda s: s.state is state and self.statuses.index(s) >= after, timeout_s)


def missing_seqs(seqs: list[int]) -> int:
    """How many seqs an increasing run that started at 0 lacks.

    A live sink drops frames when a stream outruns its quota (the burst
    FFmpeg buffers while probing a stream can do it on a busy machine), so
    tests compare this with the drops the batcher counted, instead of asking
    for an unbroken 0..n-1 that only a fast enough host gives.
    """
    assert seqs == sorted(set(seqs)), f"seqs out of order or repeated: {seqs[:20]}"
    return (seqs[0] if seqs else 0) + sum(b - a - 1 for a, b in itertools.pairwise(seqs))


@dataclass
class Received:
    meta: FrameMeta
    t_taken: float


class DrainedBatcher:
    """A real Batcher over a real FrameRing, drained by a test thread (optionally slowly)."""

    def __init__(self, stream_ids: list[str], *, live: bool, input_hw: tuple[int, int] = (96, 128), slots: int = 8,
                 quota: int = 4, max_staleness_s: float = 0.5, consume_s: float = 0.0,
                 inspect: Callable[[Slot], None] | None = None, max_batch: int = 4) -> None:
        self.ring = FrameRing(slots, *input_hw)
        self.batcher = Batcher(self.ring, max_batch=max_batch, max_wait_s=0.005, quota=quota)
        for stream_id in stream_ids:
            self.batcher.add_stream(stream_id, live, max_staleness_s)
        self.consume_s = consume_s
        self.inspect = inspect
        self.close_calls: dict[str, int] = {s: 0 for s in stream_ids}
        self.received: dict[str, list[Received]] = {s: [] for s in stream_ids}
        self.ended: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="test.drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self.batcher.next_batch(self._stop)
            if batch is None:
                if self._stop.is_set() or len(self.ended) == len(self.received):
                    return
                continue
            now = time.monotonic()
            with self._lock:
                for slot in batch.slots:
                    if self.inspect is not None:
                        self.inspect(slot)
                    self.received[slot.meta.stream_id].append(Received(slot.meta, now))
                self.ended.extend(batch.ended)
            if self.consume_s and batch.slots:
                time.sleep(self.consume_s)
            self.batcher.release(batch.slots)

    # the FrameSink the sources feed: the batcher's, counting close_stream calls
    def acquire(self, stream_id: str, stop: threading.Event) -> Slot | None:
        return self.batcher.acquire(stream_id, stop)

    def commit(self, slot: Slot, meta: FrameMeta) -> None:
        self.batcher.commit(slot, meta)

    def abandon(self, slot: Slot) -> None:
        self.batcher.abandon(slot)

    def count_drop(self, stream_id: str, frames: int = 1) -> None:
        self.batcher.count_drop(stream_id, frames)

    def close_stream(self, stream_id: str) -> None:
        self.close_calls[stream_id] += 1
        self.batcher.close_stream(stream_id)

    def dropped(self, stream_id: str) -> int:
        return self.batcher.dropped(stream_id)

    def seqs(self, stream_id: str) -> list[int]:
        with self._lock:
            return [r.meta.seq for r in self.received[stream_id]]

    def count(self, stream_id: str) -> int:
        with self._lock:
            return len(self.received[stream_id])

    def wait_count(self, stream_id: str, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count(stream_id) >= count:
                return True
            time.sleep(0.02)
        return self.count(stream_id) >= count

    def wait_ended(self, stream_id: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and stream_id not in self.ended:
            time.sleep(0.02)
        return stream_id in self.ended

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
