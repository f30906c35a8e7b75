"""Shared pieces of the benchmarks: statistics, loopback ports, the worker subprocess and a raw SUB socket.

A *worker* is ``python -m app run ...`` (what an operator types as
``detstream run``) in its own session, so that it can be ended by its own
process group. While it runs, thread ``bench.sub`` receives its messages and
thread ``bench.rss`` samples the resident memory of its process tree; neither
parses anything until the worker has exited, so the measuring process takes
as little of the two cores as it can.
"""

from __future__ import annotations

import math
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
from typing import Any

import numpy as np
import psutil
import zmq

from app.publish.messages import decode

REPO_ROOT = Path(__file__).resolve().parents[2]
RSS_SAMPLE_S = 0.1
CHILDREN_EVERY_S = 1.0


def stat(values: list[float], digits: int = 2) -> dict[str, Any]:
    """Median and spread of repeated runs: ``{"median", "min", "max", "runs"}``."""
    runs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not runs:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {"median": round(float(np.median(runs)), digits), "min": round(min(runs), digits),
            "max": round(max(runs), digits), "runs": [round(v, digits) for v in runs]}


def percentiles(values: list[float], points: tuple[int, ...] = (50, 95, 99), digits: int = 1) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``values`` (empty dict when there are none)."""
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{p}": round(float(np.percentile(arr, p)), digits) for p in points}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Received:
    """One message as it arrived: ``t_recv`` is this process's ``time.monotonic()``."""

    t_recv: float
    topic: bytes
    payload: bytes


class RawSubscriber:
    """A plain pyzmq SUB socket on thread ``bench.sub``, recording messages unparsed until :meth:`stop`."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.messages: list[Received] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.sub", daemon=True)

    def start(self) -> RawSubscriber:
        self._thread.start()
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.linger = 0
            sub.rcvhwm = 0  # never drop on our side: every message counts
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(self.endpoint)
            self._ready.set()
            append = self.messages.append
            while not self._stop.is_set():
                if sub.poll(50, zmq.POLLIN):
                    while True:
                        try:
                            topic, payload = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        append(Received(time.monotonic(), topic, payload))

    def stop(self, settle_s: float = 0.3) -> list[Received]:
        """Wait ``settle_s`` for messages still on the wire, then close; returns everything received."""
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join(5)
        return self.messages


def _proc_stat() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / tick, sum(fields) / tick


class Background:
    """CPU used by *other* processes while a measurement runs, in cores (0.0 on a quiet machine).

    ``own_cpu_s`` is what the measured processes used themselves (this process
    for in-process runs, plus the worker tree for subprocess runs).
    """

    def __init__(self) -> None:
        self._busy0, _ = _proc_stat()
        self._own0 = _own_cpu_s()
        self._t0 = time.monotonic()

    def cores(self, worker_cpu_s: float = 0.0) -> float:
        busy, _ = _proc_stat()
        wall = max(time.monotonic() - self._t0, 1e-3)
        other = (busy - self._busy0) - (_own_cpu_s() - self._own0) - worker_cpu_s
        return round(max(other, 0.0) / wall, 2)


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.2, window_s: float = 1.0) -> float:
    """Wait (at most ``max_wait_s``) until other processes use under ``threshold_cores``; returns the last reading."""
    if max_wait_s <= 0:
        return -1.0
    deadline = time.monotonic() + max_wait_s
    while True:
        probe = Background()
        time.sleep(window_s)
        load = probe.cores()
        if load < threshold_cores or time.monotonic() >= deadline:
            return load


class RssSampler:
    """Samples the resident set of a process and all its children on thread ``bench.rss``.

    ``peak_bytes`` is the largest sampled tree total; ``hwm_bytes`` is the
    kernel's own high-water mark (``VmHWM``) of the main process, which also
    catches peaks shorter than the sampling interval.
    """

    def __init__(self, pid: int, interval_s: float = RSS_SAMPLE_S) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.hwm_bytes = 0
        self.cpu_s = 0.0
        self.cpu_series: list[tuple[float, float]] = []  # (monotonic time, tree CPU seconds)
        self.rss_series: list[tuple[float, int]] = []  # (monotonic time, tree RSS bytes)
        self.busy_series: list[tuple[float, float]] = []  # (monotonic time, the machine's busy CPU seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.rss", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        """Every ``interval_s``: RSS and CPU of the tree from ``/proc`` directly; the tree itself once a second.

        psutil's ``children(recursive=True)`` reads every process on the machine: at 10 Hz that took 3.5 %
        of a core from the two the measured worker runs on (during e2e runs only, not model-only).
        """
        pids, listed = [self.pid], 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - listed >= CHILDREN_EVERY_S:
                pids, listed = self._tree(), now
                if not pids:
                    return
            samples = [_proc_sample(pid) for pid in pids]
            if samples[0] is None:
                return  # the worker is gone
            total = sum(rss for rss, _ in filter(None, samples))
            cpu = sum(cpu for _, cpu in filter(None, samples))
            self.peak_bytes = max(self.peak_bytes, total)
            self.cpu_s = max(self.cpu_s, cpu)
            self.cpu_series.append((now, self.cpu_s))
            self.rss_series.append((now, total))
            self.busy_series.append((now, _proc_stat()[0]))
            self.hwm_bytes = max(self.hwm_bytes, _vm_hwm(self.pid))
            self._stop.wait(self.interval_s)

    def _tree(self) -> list[int]:
        try:
            root = psutil.Process(self.pid)
            return [self.pid] + [child.pid for child in root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    @property
    def peak_mb(self) -> float:
        """Largest sampled RSS of the tree (what psutil sees)."""
        return self.peak_bytes / 2**20

    @property
    def hwm_mb(self) -> float:
        """The kernel's high-water mark of the main process (catches short peaks, e.g. while loading)."""
        return self.hwm_bytes / 2**20


_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_sample(pid: int) -> tuple[int, float] | None:
    """(resident bytes, user + system CPU seconds) of one process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            rss = int(statm.read().split()[1]) * _PAGE
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return rss, (int(fields[11]) + int(fields[12])) / _TICK


def _vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


@dataclass
class WorkerRun:
    """What one ``detstream run`` subprocess did, as seen from outside it."""

    argv: list[str]
    returncode: int
    t_start: float
    t_exit: float
    peak_rss_mb: float
    hwm_mb: float
    worker_cpu_s: float
    background_cores: float
    timed_out: bool
    cpu_series: list[tuple[float, float]]
    rss_series: list[tuple[float, int]]
    messages: list[Received]
    stderr_tail: str
    encoding: str = "json"
    busy_series: list[tuple[float, float]] = field(default_factory=list)
    _parsed: list[tuple[str, dict[str, Any], float]] | None = field(default=None, repr=False)

    @property
    def wall_s(self) -> float:
        return self.t_exit - self.t_start

    def parsed(self) -> list[tuple[str, dict[str, Any], float]]:
        """``(topic, payload, t_recv)`` for every message, in arrival order."""
        if self._parsed is None:
            self._parsed = [(m.topic.decode(), decode(m.payload, self.encoding), m.t_recv) for m in self.messages]
        return self._parsed

    def detections(self) -> list[tuple[dict[str, Any], float]]:
        return [(p, t) for topic, p, t in self.parsed() if topic.startswith("det/")]

    def statuses(self) -> list[dict[str, Any]]:
        return [p for topic, p, _ in self.parsed() if topic.startswith("status/")]

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """Worker CPU seconds used between two monotonic times (interpolated from the 0.1 s samples)."""
        return _between(self.cpu_series, t0, t1)

    def background_between(self, t0: float, t1: float) -> float | None:
        """CPU seconds *other* processes used between two monotonic times: the machine's busy time less the
        worker's (and this process's sampling, which is small), from the same 0.1 s samples."""
        busy, own = _between(self.busy_series, t0, t1), _between(self.cpu_series, t0, t1)
        return None if busy is None or own is None else max(busy - own, 0.0)

    def steady_peak_rss_mb(self) -> float:
        """Largest sampled RSS from the first received message on: running, without the start-up transient."""
        if not self.messages:
            return self.peak_rss_mb
        first = self.messages[0].t_recv
        return max((rss for t, rss in self.rss_series if t >= first), default=0) / 2**20

    def check(self) -> None:
        """Raise with the worker's own last words when it did not exit cleanly."""
        if self.timed_out:
            raise RuntimeError(f"worker overran its time limit: {' '.join(self.argv)}\n{self.stderr_tail}")
        if self.returncode != 0:
            raise RuntimeError(f"worker exited with {self.returncode}: {' '.join(self.argv)}\n{self.stderr_tail}")


def _between(series: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """How much a cumulative sampled quantity grew between two times (linear between samples)."""
    if len(series) < 2 or t1 <= t0:
        return None
    times, values = zip(*series, strict=True)
    return float(np.interp(t1, times, values) - np.interp(t0, times, values))


def worker_argv(args: list[str]) -> list[str]:
    """``detstream run ARGS`` as a subprocess command (the same interpreter, so the same venv)."""
    return [sys.executable, "-m", "app", "--log-level", "WARNING", "run", *args]


def run_worker(args: list[str], endpoint: str, timeout_s: float, encoding: str = "json",
               settle_s: float = 0.0) -> WorkerRun:
    """Start the subscriber, then the worker; wait for it (bounded), stop it for good if it overruns.

    ``settle_s``: first wait up to this long for other processes to leave the CPU alone.
    """
    argv = worker_argv(args)
    if settle_s > 0:
        wait_for_quiet(settle_s)
    subscriber = RawSubscriber(endpoint.removeprefix("connect+")).start()
    timed_out = False
    with tempfile.TemporaryFile(mode="w+") as log:
        background = Background()
        t_start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        sampler = RssSampler(proc.pid).start()
        try:
            returncode = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = _end(proc)
        finally:
            t_exit = time.monotonic()
            sampler.stop()
            other = background.cores(sampler.cpu_s)
            if proc.poll() is None:
                _end(proc)
        messages = subscriber.stop()
        log.seek(0)
        tail = log.read()[-4000:]
    return WorkerRun(argv, returncode, t_start, t_exit, sampler.peak_mb, sampler.hwm_mb, sampler.cpu_s, other,
                     timed_out, sampler.cpu_series, sampler.rss_series, messages, tail, encoding,
                     sampler.busy_series)


def _end(proc: subprocess.Popen) -> int:
    """SIGTERM (drain), then SIGKILL the worker's own process group after 10 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(5)
