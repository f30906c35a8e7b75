#!/usr/bin/env python3
"""Soak test: run one ``detstream run`` for a long time under churn and fail if it leaks.

    .venv/bin/python lab/soak.py --duration-s 1800 --sources 8
    .venv/bin/python lab/soak.py --duration-s 60 --sources 4 --interval-s 5     # the CI version

What runs: half the sources (rounded up) are RTSP cameras spread over two
GStreamer RTSP servers (``scripts/rtsp_server.py`` on loopback), the rest are
files played ``loop: true, realtime: true``. Sources cannot be added or
removed at run time, so churn is: every ``--restart-every-s`` one RTSP server
is killed (SIGKILL, like a crashed camera) and started again on the same
port, alternating between the two, so its mounts go through
``reconnecting`` → ``running`` again while the others keep going.

What is recorded, every ``--interval-s``, about the worker process (psutil):
RSS, open file descriptors, threads, CPU, and per stream the detection
messages received by a subscriber (``app.subscribe.Subscriber``) in the
interval. Rows go to ``samples.csv`` and everything to ``summary.json`` in
``--out``.

Warm-up. ONNX Runtime and the allocator grow in steps the first time a
batch of a new size runs (measured: +150 MB for the first batch of 8, up to
+50 MB more for the sizes after it), and a full batch only forms when frames
pile up, which may first happen at any time. So, in the middle of the warm-up,
the worker is frozen (SIGSTOP) for ``--freeze-s`` seconds, like a long GC
pause or a starved CPU: frames pile up, and when it resumes it runs full
batches. After that, further growth is not a warm-up.

Verdict (exit 1 on any): after ``--warmup-s`` (default: a quarter of the run,
at least 20 s), with "start" the first three samples and "end" the last
three:

* RSS grows: median(end) > median(start) × (1 + ``--max-rss-growth``, 5 %);
* fds or threads grow: min(end) > max(start) (a steady climb, not a
  transient reconnect thread);
* a stream published nothing in the last third of the run;
* the subscriber saw a seq gap that ``dropped_before`` does not explain
  (messages lost between worker and subscriber);
* the worker did not exit 0 on SIGTERM at the end.

Everything started here is killed at the end (process groups), whatever happens.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from app.subscribe import DetectionMessage, StatusMessage, Subscriber  # noqa: E402
from tests.integration.rtsp import RtspServer, make_clip  # noqa: E402


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    threads: int
    cpu_percent: float
    messages: dict[str, int]


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_growth: float = 0.0
    fds: tuple[int, int] = (0, 0)
    threads: tuple[int, int] = (0, 0)


class Counter:
    """A subscriber thread counting detection messages per stream and status states."""

    def __init__(self, endpoint: str) -> None:
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.states: defaultdict[str, list[str]] = defaultdict(list)
        self.unexplained_gaps = 0
        self.restarts = 0
        self._endpoint = endpoint
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="soak.subscriber", daemon=True)

    def start(self) -> Counter:
        self._thread.start()
        return self

    def _run(self) -> None:
        with Subscriber(self._endpoint) as sub:
            while not self._stop.is_set():
                for message in sub.iter_messages(timeout_s=0.5):
                    with self._lock:
                        if isinstance(message, DetectionMessage):
                            self.counts[message.stream] += 1
                        elif isinstance(message, StatusMessage):
                            states = self.states[message.stream]
                            if not states or states[-1] != message.state:
                                states.append(message.state)
                    if self._stop.is_set():
                        break
                self.unexplained_gaps = sub.stats.unexplained_gaps
                self.restarts = sub.stats.restarts

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, cameras: list[tuple[str, str]], files: list[tuple[str, Path]], endpoint: str,
                 metrics_port: int) -> None:
    retry = "    reconnect: {initial_s: 0.2, max_s: 2.0, reset_after_s: 5.0}\n"
    lines = ["sources:\n"]
    lines += [f"  - id: {sid}\n    url: {url}\n{retry}" for sid, url in cameras]
    lines += [f"  - id: {sid}\n    url: {clip}\n    loop: true\n    realtime: true\n" for sid, clip in files]
    lines.append(f"engine:\n  max_batch: 8\npublish:\n  endpoint: {endpoint}\n  heartbeat_s: 2.0\n")
    lines.append(f"metrics:\n  port: {metrics_port}\n")
    path.write_text("".join(lines))


def freeze(worker: subprocess.Popen, seconds: float) -> None:
    """SIGSTOP the worker, then SIGCONT it: frames pile up, so the engine runs full batches afterwards."""
    os.killpg(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
    print(f"  froze the worker for {seconds:g} s (warm-up: full batches)", flush=True)


def sample(proc: psutil.Process, started: float, counter: Counter) -> Sample:
    with proc.oneshot():
        return Sample(round(time.monotonic() - started, 1), round(proc.memory_info().rss / 2**20, 1),
                      proc.num_fds(), proc.num_threads(), proc.cpu_percent(None), counter.snapshot())


def judge(samples: list[Sample], warmup_s: float, duration_s: float, streams: list[str], counter: Counter,
          code: int | None, max_rss_growth: float) -> Verdict:
    verdict = Verdict()
    steady = [s for s in samples if s.t_s >= warmup_s]
    if len(steady) < 4:
        verdict.failures.append(f"only {len(steady)} samples after the {warmup_s:.0f} s warm-up (need 4)")
        return verdict
    start, end = steady[:3], steady[-3:]
    verdict.rss_start_mb = statistics.median(s.rss_mb for s in start)
    verdict.rss_end_mb = statistics.median(s.rss_mb for s in end)
    verdict.rss_growth = verdict.rss_end_mb / verdict.rss_start_mb - 1
    if verdict.rss_growth > max_rss_growth:
        verdict.failures.append(f"RSS grew {verdict.rss_growth:.1%} after warm-up "
                                f"({verdict.rss_start_mb:.0f} -> {verdict.rss_end_mb:.0f} MB)")
    for name in ("fds", "threads"):
        first, last = max(getattr(s, name) for s in start), min(getattr(s, name) for s in end)
        setattr(verdict, name, (first, last))
        if last > first:
            verdict.failures.append(f"{name} grew after warm-up: at most {first} at the start, "
                                    f"at least {last} at the end")
    cutoff = duration_s * 2 / 3
    late = [s for s in samples if s.t_s >= cutoff]
    if late:
        before = next((s for s in reversed(samples) if s.t_s < cutoff), samples[0])
        for stream in streams:
            if late[-1].messages.get(stream, 0) - before.messages.get(stream, 0) <= 0:
                verdict.failures.append(f"stream {stream} published nothing in the last third of the run")
    if counter.unexplained_gaps:
        verdict.failures.append(f"{counter.unexplained_gaps} seq gaps not explained by dropped_before")
    if code != 0:
        verdict.failures.append(f"the worker exited {code} on SIGTERM (expected 0)")
    return verdict


def write_outputs(out: Path, samples: list[Sample], streams: list[str], summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "rss_mb", "fds", "threads", "cpu_percent", *[f"msgs_{s}" for s in streams]])
        for s in samples:
            writer.writerow([s.t_s, s.rss_mb, s.fds, s.threads, s.cpu_percent,
                             *[s.messages.get(stream, 0) for stream in streams]])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=1800)
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--interval-s", type=float, default=10)
    parser.add_argument("--restart-every-s", type=float, help="default: a sixth of the run, between 10 and 120 s")
    parser.add_argument("--warmup-s", type=float, help="default: a quarter of the run, at least 20 s")
    parser.add_argument("--freeze-s", type=float, default=3.0,
                        help="SIGSTOP the worker this long at 60 %% of the warm-up, so full batches run (0: never)")
    parser.add_argument("--fps", type=int, default=2, help="frame rate of every camera and file")
    parser.add_argument("--max-rss-growth", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="default: out/soak-<time>")
    args = parser.parse_args(argv)
    if args.sources < 2:
        parser.error("--sources must be at least 2 (a camera and a file)")
    if args.restart_every_s is None:
        args.restart_every_s = min(120.0, max(10.0, args.duration_s / 6))
    if args.warmup_s is None:
        args.warmup_s = max(20.0, args.duration_s / 4)
    if args.out is None:
        args.out = ROOT / "out" / time.strftime("soak-%Y%m%d-%H%M%S")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cameras_n = (args.sources + 1) // 2
    work = Path(tempfile.mkdtemp(prefix="detstream-soak-"))
    servers: list[RtspServer] = []
    worker: subprocess.Popen | None = None
    counter: Counter | None = None
    samples: list[Sample] = []
    restarts: list[dict] = []
    code: int | None = None
    streams: list[str] = []
    early = ""
    try:
        clip = make_clip(work / "loop.mp4", frames=10 * args.fps, fps=args.fps)
        mounts = [{}, {}]
        for index in range(cameras_n):
            mounts[index % 2][f"/cam{index}"] = f"pattern:320x240@{args.fps}"
        servers = [RtspServer(m).start() for m in mounts if m]
        cameras = [(f"cam{i}", servers[i % len(servers)].url(f"/cam{i}")) for i in range(cameras_n)]
        files = [(f"file{i}", clip) for i in range(args.sources - cameras_n)]
        streams = [sid for sid, _ in cameras + files]
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        config = work / "soak.yaml"
        write_config(config, cameras, files, endpoint, free_port())
        counter = Counter(endpoint).start()
        worker = subprocess.Popen([sys.executable, "-m", "app", "run", str(config), "--no-progress"], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=(work / "worker.log").open("w"),
                                  start_new_session=True)
        proc = psutil.Process(worker.pid)
        proc.cpu_percent(None)
        started = time.monotonic()
        next_sample, next_restart, which = args.interval_s, args.restart_every_s, 0
        freeze_at = 0.6 * args.warmup_s if args.freeze_s > 0 else None
        print(f"soak: {args.sources} sources ({cameras_n} RTSP on {len(servers)} servers), {args.duration_s:.0f} s, "
              f"logs in {work}", flush=True)
        while (elapsed := time.monotonic() - started) < args.duration_s:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited early with {worker.returncode}; see {work / 'worker.log'}")
            if freeze_at is not None and elapsed >= freeze_at:
                freeze_at = None
                freeze(worker, args.freeze_s)
            if elapsed >= next_restart and elapsed < args.duration_s - args.interval_s:
                server = servers[which % len(servers)]
                server.kill()
                time.sleep(1.0)
                server.start()
                restarts.append({"t_s": round(elapsed, 1), "server": which % len(servers),
                                 "mounts": sorted(server.mounts)})
                which += 1
                next_restart += args.restart_every_s
            if elapsed >= next_sample:
                samples.append(sample(proc, started, counter))
                last = samples[-1]
                print(f"  t={last.t_s:6.0f}s rss={last.rss_mb:7.1f}MB fds={last.fds:4d} threads={last.threads:3d} "
                      f"cpu={last.cpu_percent:5.0f}% msgs={sum(last.messages.values())}", flush=True)
                next_sample += args.interval_s
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(20)
        except subprocess.TimeoutExpired:
            code = None
    except RuntimeError as error:
        early = str(error)
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        if counter is not None:
            counter.stop()
        for server in servers:
            server.kill()
    verdict = judge(samples, args.warmup_s, args.duration_s, streams, counter, code, args.max_rss_growth)
    if early:
        verdict.failures.insert(0, early)
    summary = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "verdict": asdict(verdict), "restarts": restarts, "states": dict(counter.states),
               "samples": [asdict(s) for s in samples], "worker_log": str(work / "worker.log")}
    write_outputs(args.out, samples, streams, summary)
    print(f"soak: RSS {verdict.rss_start_mb:.0f} -> {verdict.rss_end_mb:.0f} MB ({verdict.rss_growth:+.1%}), "
          f"fds {verdict.fds[0]} -> {verdict.fds[1]}, threads {verdict.threads[0]} -> {verdict.threads[1]}, "
          f"{len(restarts)} server restarts; results in {args.out}")
    for failure in verdict.failures:
        print(f"soak: FAIL: {failure}")
    return 1 if verdict.failures else 0


if __name__ == "__main__":
    sys.exit(main())
