"""One ``detstream run`` subprocess, watched from outside: its messages, its exit and its memory.

The worker is ``python -m app run ...`` (what an operator types as
``detstream run``) in its own session, so that it can be ended with its whole
process group. While it runs, thread ``bench.sub`` receives what it publishes
with the public :class:`app.subscribe.Subscriber`, and thread ``bench.rss``
reads its resident memory from ``/proc/<pid>/status`` (``VmRSS``, and the
kernel's high-water mark ``VmHWM``, which also catches peaks shorter than the
sampling interval).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.subscribe import DetectionMessage, StatusMessage, Subscriber

REPO_ROOT = Path(__file__).resolve().parents[2]
RSS_SAMPLE_S = 0.2
STOP_GRACE_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of one process in KiB (empty when it is gone or the OS has no ``/proc``)."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return found


class Listener:
    """The worker's messages, received on thread ``bench.sub`` until :meth:`stop`."""

    def __init__(self, endpoint: str) -> None:
        self.detections: list[DetectionMessage] = []
        self.statuses: list[StatusMessage] = []
        self._subscriber = Subscriber(endpoint, rcvhwm=0)  # never drop on our side: every message counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.sub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._subscriber.iter_messages(timeout_s=0.1):
                if isinstance(message, DetectionMessage):
                    self.detections.append(message)
                else:
                    self.statuses.append(message)

    def stop(self, settle_s: float = 0.3) -> None:
        """Wait ``settle_s`` for messages still on the wire, then close."""
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join(5)
        self._subscriber.close()


class _RssSampler:
    """Largest ``VmRSS`` since the first message, and the last ``VmHWM`` seen, on thread ``bench.rss``."""

    def __init__(self, pid: int, listener: Listener) -> None:
        self.pid, self.listener = pid, listener
        self.hwm_kb = self.running_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            sample = memory_kb(self.pid)
            if not sample:
                return
            self.hwm_kb = max(self.hwm_kb, sample.get("VmHWM", 0))
            if self.listener.detections:  # running: the start-up transient (model load) is behind us
                self.running_kb = max(self.running_kb, sample.get("VmRSS", 0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


@dataclass
class WorkerRun:
    """What one ``detstream run`` subprocess did, as seen from outside it."""

    argv: list[str]
    returncode: int
    wall_s: float
    timed_out: bool
    peak_rss_mb: float
    """The kernel's high-water mark of the worker's resident memory, start-up included."""
    running_rss_mb: float
    """The largest resident memory sampled once the first result was out."""
    log_tail: str
    detections: list[DetectionMessage] = field(default_factory=list)
    statuses: list[StatusMessage] = field(default_factory=list)

    def check(self) -> None:
        """Raise with the worker's own last words when it did not exit cleanly."""
        if self.timed_out:
            raise RuntimeError(f"worker overran its time limit: {' '.join(self.argv)}\n{self.log_tail}")
        if self.returncode != 0:
            raise RuntimeError(f"worker exited with {self.returncode}: {' '.join(self.argv)}\n{self.log_tail}")


def run_worker(args: list[str], endpoint: str, timeout_s: float) -> WorkerRun:
    """Start the listener, then ``detstream run ARGS``; wait for it (bounded), end it for good if it overruns."""
    argv = [sys.executable, "-m", "app", "--log-level", "WARNING", "run", *args]
    listener = Listener(endpoint)
    timed_out = False
    with tempfile.TemporaryFile(mode="w+") as log:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        sampler = _RssSampler(proc.pid, listener)
        try:
            returncode = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = _end(proc)
        except BaseException:  # Ctrl-C or SIGTERM of the bench: no worker is left behind
            _end(proc)
            raise
        finally:
            wall_s = time.monotonic() - started
            sampler.stop()
            listener.stop()
        log.seek(0)
        tail = log.read()[-4000:]
    return WorkerRun(argv, returncode, wall_s, timed_out, sampler.hwm_kb / 1024, sampler.running_kb / 1024, tail,
                     listener.detections, listener.statuses)


def _end(proc: subprocess.Popen) -> int:
    """SIGTERM (the worker drains), then SIGKILL its process group after :data:`STOP_GRACE_S`."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(5)
