"""File mode: ``detstream run --source CLIP`` end to end, decode → publish, counted at a subscriber.

Throughput is measured where a user sees it, from the first published result
to the last: results go out in bursts (one batch at a time), so the first
burst opens the clock and is not counted. Wall time from process start to
exit (imports, model load, warm-up, drain) is reported separately. Latency is
each message's ``latency_ms.total`` (capture to publish); in file mode the
decoder is held back by backpressure, so most of it is frames waiting for the
engine, by design.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.bench.results import FileMode, Precision, Spread
from app.bench.worker import free_port, run_worker
from app.subscribe import DetectionMessage

BURST_GAP_S = 0.004
"""Results published closer than this to the previous one belong to the same burst (one batch)."""


@dataclass(frozen=True)
class FileRun:
    command: str
    engine: str
    frames: int
    lossless: bool
    fps: float
    wall_s: float
    p50_ms: float
    p99_ms: float
    peak_rss_mb: float


def first_burst(times: list[float]) -> int:
    """How many results went out together with the first one."""
    count = 1
    while count < len(times) and times[count] - times[count - 1] < BURST_GAP_S:
        count += 1
    return count


def throughput(dets: list[DetectionMessage]) -> float:
    """Results per second from the end of the first burst to the last result."""
    times = sorted(d.published_at for d in dets)
    burst = first_burst(times)
    span = times[-1] - times[0]
    if span <= 0 or len(times) <= burst:
        return len(times) / max(span, 1e-9)
    return (len(times) - burst) / span


def run_file_once(clip: Path, label: str, model_path: Path, backend: str, timeout_s: float,
                  precision: str | None = None) -> FileRun:
    """``detstream run`` on ``clip`` once; ``precision`` adds ``--precision`` (the config's default otherwise)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = ["--source", f"{label}={clip}", "--publish", endpoint, "--no-progress", "--model", str(model_path),
            "--engine", backend, *(["--precision", precision] if precision else [])]
    run = run_worker(args, endpoint, timeout_s)
    run.check()
    dets = run.detections
    if len(dets) < 2:
        raise RuntimeError(f"file mode: only {len(dets)} results received\n{run.log_tail}")
    final = [s.state for s in run.statuses if s.state in ("ended", "failed")]
    totals = np.array([d.latency_ms.total for d in dets])
    return FileRun(command="detstream run " + " ".join(args), engine=dets[0].engine, frames=len(dets),
                   lossless=sorted(d.seq for d in dets) == list(range(len(dets))) and final[-1:] == ["ended"],
                   fps=throughput(dets), wall_s=run.wall_s, p50_ms=float(np.percentile(totals, 50)),
                   p99_ms=float(np.percentile(totals, 99)), peak_rss_mb=run.peak_rss_mb)


def summarize_file(precision: Precision, clip: str, runs: list[FileRun], model_only_fps: float | None,
                   naive_fps: float | None) -> FileMode:
    fps = Spread.of([r.fps for r in runs])
    return FileMode(
        precision=precision, clip=clip, command=runs[-1].command, engine=runs[-1].engine, frames=runs[-1].frames,
        lossless=all(r.lossless for r in runs), fps=fps, wall_s=Spread.of([r.wall_s for r in runs]),
        p50_ms=Spread.of([r.p50_ms for r in runs], 1), p99_ms=Spread.of([r.p99_ms for r in runs], 1),
        peak_rss_mb=Spread.of([r.peak_rss_mb for r in runs], 1),
        of_model_only=_ratio(fps.median, model_only_fps), of_naive=_ratio(fps.median, naive_fps))


def _ratio(value: float | None, reference: float | None) -> float | None:
    return round(value / reference, 3) if value and reference else None

