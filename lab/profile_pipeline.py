#!/usr/bin/env python
"""Profile ``detstream run`` in file mode: where the wall time of each thread and the CPU time of the process go.

Two views of one run (the worker is ``py-spy record -- python -m app run --source CLIP ...``, a SUB
socket in this process receives what it publishes):

* **per-thread wall time** (py-spy, ``--idle`` so that waiting is sampled too): every sample is put in the
  first category (from the innermost frame outwards) whose rule matches, e.g. ``infer`` for ONNX Runtime's
  ``run_with_iobinding``, ``letterbox`` for :func:`app.preprocess.letterbox_into`, ``wait: slot`` for a
  decoder blocked on backpressure;
* **CPU seconds per OS thread** (``/proc/PID/task/*/stat``, sampled while it runs; stage threads carry
  their names to the kernel, see :mod:`app.threads`), which also counts
  ONNX Runtime's own pool threads, which py-spy cannot see (they run no Python).

Usage::

    python lab/profile_pipeline.py [--clip vtest|bikes|PATH] [--frames N] [--rate 100] [--out DIR]
                                       [-- EXTRA detstream run ARGS, e.g. --max-batch 4]

Needs ``py-spy`` (``pip install py-spy``) and permission to trace a child process.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench.clips import clip_label, head_copy, resolve_clip
from app.bench.worker import Listener, free_port

REPO_ROOT = Path(__file__).resolve().parents[1]

# (category, function regex, source-line regex), tried from the innermost frame outwards; the first rule whose
# function name ("[Class.]name") and source line (read from the file, so edits elsewhere do not shift it) match wins.
RULES = [
    ("infer: onnxruntime run", r"run_with_iobinding|^InferenceSession\.run$", None),
    ("infer: copy frames into the input", r"submit$|_stage$", r"np\.copyto"),
    ("infer: worker waiting for a frame", r"^(CpuWorkers|FrameWorkers)\._loop$", r"_jobs\.get"),
    ("infer: worker bookkeeping", r"^(CpuWorkers|FrameWorkers)\.|^(WorkerHandle|JobHandle)\.job_done$", None),
    ("engine: queueing a batch's frames", r"^OrtEngine\.submit$|^OrtEngine\._|^(CpuWorkers|FrameWorkers)\.put$", None),
    ("letterbox: resize", r"letterbox_into$", r"cv2\.resize"),
    ("letterbox: pad + float CHW", r"letterbox_into$", None),
    ("decode: codec", r"_decode$", r"\.decode\("),
    ("decode: demux (read)", r"_decode$", r"for packet in"),
    ("decode: yuv -> rgb", r"^RgbConverter\.|_gather_planes$|^_rows$", None),
    ("decode: yuv -> rgb", r"_deliver$", r"to_ndarray|reformat|\.convert\("),
    ("wait: ring slot (backpressure)", r"acquire$", r"wait"),
    ("wait: realtime pacing", r"^RealtimePacer\.wait$|_pace", None),
    ("decode: other (loop, slot, meta, commit)", r"_deliver$|_decode$", None),
    ("engine: waiting for a batch", r"next_batch$", None),
    ("engine: other", r"^InferenceStage\.", None),
    ("post: decode + NMS", r"decode_batch$|batched_nms$", None),
    ("post: payload + encode", r"detection_payload$|^encode$", None),
    ("post: zmq send", r"publish_detections$|send_multipart$", None),
    ("post: waiting for results", r"^ResultsStage\._run$", r"get\("),
    ("post: waiting for results", r"^(WorkerHandle|JobHandle)\.(wait|finished)$", None),
    ("post: other", r"^ResultsStage\.", None),
    ("startup: imports", r"_find_and_load$", None),
    ("startup: model and engine", r"create_engine$|load_spec$|_build_and_start$|load_model_spec$", None),
    ("main: progress loop", r"^_wait$", None),
]
FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+):(?P<line>\d+)\)$")
THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clip", default="vtest")
    p.add_argument("--frames", type=int, help="only the first N frames")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "profile")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "detstream" / "bench")
    return p.parse_args(argv), extra


def find_py_spy() -> str:
    candidates = [Path(sys.executable).with_name("py-spy"), shutil.which("py-spy")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("py-spy not found: pip install py-spy")


class ThreadCpu:
    """Samples utime+stime of every OS thread of a process (``bench.cpu`` thread); keeps the last value seen."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.cpu_s: dict[int, float] = {}
        self.comm: dict[int, str] = {}
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.cpu", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def start(self) -> ThreadCpu:
        self._thread.start()
        return self

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            if self.pid is None:
                try:
                    children = psutil.Process(self.parent_pid).children()
                except psutil.NoSuchProcess:
                    return
                self.pid = children[0].pid if children else None
            if self.pid is not None:
                self._sample(self.pid)
            self._stop.wait(0.2)

    def _sample(self, pid: int) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            self.cpu_s[int(tid)] = (int(fields[11]) + int(fields[12])) / self._tick
            self.comm[int(tid)] = comm

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def categorise(stack: list[str]) -> str:
    for frame in reversed(stack):
        match = FRAME.match(frame)
        func = match.group("func") if match else frame
        source = _source_line(match.group("file"), int(match.group("line"))) if match else ""
        for name, func_pattern, source_pattern in RULES:
            if re.search(func_pattern, func) and (source_pattern is None or re.search(source_pattern, source)):
                return name
    return "other: " + (stack[-1].split(" (")[0] if stack else "?")


def _source_line(file: str, line: int) -> str:
    path = Path(file) if Path(file).is_absolute() else REPO_ROOT / file
    return linecache.getline(str(path), line)


def parse_raw(path: Path) -> tuple[dict[int, str], dict[int, Counter], Counter]:
    names: dict[int, str] = {}
    per_thread: dict[int, Counter] = defaultdict(Counter)
    leaves: Counter = Counter()
    for line in path.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text:
            continue
        frames = stack_text.split(";")
        match = THREAD.match(frames[0])
        if not match:
            continue
        tid = int(match.group(1))
        if match.group(2):
            names[tid] = match.group(2).strip()
        count = int(count_text)
        stack = [f for f in frames[1:] if not f.startswith("process ")]
        per_thread[tid][categorise(stack)] += count
        if stack:
            leaves[stack[-1]] += count
    return names, per_thread, leaves


def main(argv: list[str]) -> int:
    opts, extra = parse_args(argv)
    clip = resolve_clip(opts.clip)
    if opts.frames:
        clip = head_copy(clip, opts.frames, opts.cache_dir)
    opts.out.mkdir(parents=True, exist_ok=True)
    raw = opts.out / f"pyspy-{clip_label(opts.clip)}.txt"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    worker = [sys.executable, "-m", "app", "--log-level", "WARNING", "run", "--source", f"clip={clip}",
              "--publish", endpoint, "--no-progress", *extra]
    command = [find_py_spy(), "record", "--threads", "--idle", "--rate", str(opts.rate), "--format", "raw",
               "-o", str(raw), "--", *worker]
    subscriber = Listener(endpoint)
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = ThreadCpu(proc.pid).start()
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    cpu.stop()
    wall = time.monotonic() - started
    subscriber.stop()
    dets = subscriber.detections
    if proc.returncode != 0 or not raw.exists():
        print(err[-3000:], file=sys.stderr)
        return 1
    names, per_thread, leaves = parse_raw(raw)
    span = dets[-1].published_at - dets[0].published_at if len(dets) > 1 else 0.0
    fps = (len(dets) - 1) / span if span > 0 else 0.0
    report = summary(names, per_thread, leaves, cpu, opts.rate)
    report.update({"clip": str(clip), "frames_published": len(dets), "fps_at_subscriber": round(fps, 2),
                   "wall_s": round(wall, 1), "worker": " ".join(worker[2:]), "raw": str(raw)})
    (opts.out / f"profile-{clip_label(opts.clip)}.json").write_text(json.dumps(report, indent=1))
    print_summary(report)
    return 0


def summary(names: dict[int, str], per_thread: dict[int, Counter], leaves: Counter, cpu: ThreadCpu,
            rate: int) -> dict:
    threads = []
    for tid, counts in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        threads.append({"tid": tid, "name": names.get(tid, cpu.comm.get(tid, "?")), "samples": total,
                        "wall_s": round(total / rate, 2), "cpu_s": round(cpu.cpu_s.get(tid, 0.0), 2),
                        "categories": {k: round(100 * v / total, 1) for k, v in counts.most_common()}})
    python_tids = set(per_thread)
    others = {tid: s for tid, s in cpu.cpu_s.items() if tid not in python_tids}
    total_cpu = sum(cpu.cpu_s.values())
    return {"threads": threads,
            "native_threads_cpu_s": round(sum(others.values()), 2),
            "native_threads": {f"{tid} ({cpu.comm.get(tid, '?')})": round(s, 2) for tid, s in others.items() if s},
            "process_cpu_s": round(total_cpu, 2),
            "top_leaf_frames": [{"frame": f, "samples": n} for f, n in leaves.most_common(15)]}


def print_summary(report: dict) -> None:
    print(f"{report['frames_published']} frames, {report['fps_at_subscriber']} fps at the subscriber, "
          f"wall {report['wall_s']} s; process CPU {report['process_cpu_s']} s "
          f"(of which ONNX Runtime pool / other native threads {report['native_threads_cpu_s']} s)")
    for thread in report["threads"]:
        print(f"\n{thread['name']} (tid {thread['tid']}): {thread['wall_s']} s sampled, {thread['cpu_s']} s CPU")
        for category, share in thread["categories"].items():
            if share >= 0.5:
                print(f"  {share:5.1f}%  {category}")
    print("\ntop leaf frames (all threads, waiting included):")
    for entry in report["top_leaf_frames"]:
        print(f"  {entry['samples']:6d}  {entry['frame']}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
