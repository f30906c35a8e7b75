"""Live mode: K simulated cameras on one worker, the capacity search, and memory per camera.

Each camera is a ``realtime`` + ``loop`` file source in ``live`` mode with
``max_fps`` (see :mod:`app.bench.clips` for the copies and their phases), as
an RTSP camera of that frame rate delivers. Per run, from the messages:

* latency: ``published_at − captured_at`` (capture to publish on this one
  machine), p50 and p99 over every camera, leaving out the first
  :attr:`LiveSettings.warmup_s` of capture time (all cameras open at once);
* drops per camera: the larger of the ``dropped_before`` sum and the last
  status's ``dropped`` (which also counts frames dropped after the camera's
  last published result);
* resident memory of the worker (:mod:`app.bench.worker`).

The search runs K upward and stops at the first K that fails: a frame dropped
in any repeat, or a median p99 over the bound. The capacity is the largest K
below it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from app.bench.results import Live, LiveStep, Memory, Precision, Spread
from app.bench.worker import WorkerRun, free_port, run_worker

logger = logging.getLogger(__name__)

RunCache = dict[int, list["LiveRun"]]
"""K → the live runs already made with K cameras (memory reuses the search's runs)."""


@dataclass(frozen=True)
class LiveSettings:
    cameras: Callable[[int], list[Path]]
    """K → one clip per camera."""
    model_path: Path
    backend: str
    fps: float
    duration_s: float
    p99_bound_ms: float
    precision: str | None = None
    """``--precision`` for the runs; None leaves the config's default."""

    @property
    def warmup_s(self) -> float:
        return min(2.0, self.duration_s / 4)


@dataclass(frozen=True)
class LiveRun:
    engine: str
    published_fps: float
    p50_ms: float | None
    p99_ms: float | None
    drops: int
    peak_rss_mb: float
    running_rss_mb: float


def write_config(settings: LiveSettings, k: int, path: Path) -> Path:
    """The cameras as a config file (only sources; the rest is on the command line, as an operator writes it)."""
    sources = [{"id": f"cam{i:02d}", "url": str(clip), "mode": "live", "realtime": True, "loop": True,
                "max_fps": settings.fps} for i, clip in enumerate(settings.cameras(k))]
    path.write_text(yaml.safe_dump({"sources": sources}, sort_keys=False))
    return path


def run_live_once(settings: LiveSettings, k: int) -> LiveRun:
    logger.info("bench: live, %d camera(s) for %g s", k, settings.duration_s)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="detstream-bench-") as tmp:
        config = write_config(settings, k, Path(tmp) / "live.yaml")
        args = [str(config), "--no-progress", "--publish", endpoint, "--model", str(settings.model_path),
                "--engine", settings.backend, "--duration", f"{settings.duration_s:g}",
                *(["--precision", settings.precision] if settings.precision else [])]
        run = run_worker(args, endpoint, settings.duration_s + 60)
    return analyse_live_run(run, k, settings.warmup_s)


def analyse_live_run(run: WorkerRun, k: int, warmup_s: float) -> LiveRun:
    run.check()
    dets = run.detections
    if not dets:
        raise RuntimeError(f"live K={k}: no results received\n{run.log_tail}")
    t0 = min(d.captured_at for d in dets) + warmup_s
    steady = [d for d in dets if d.captured_at >= t0]
    latencies = np.array([(d.published_at - d.captured_at) * 1e3 for d in steady])
    gaps: dict[str, int] = {f"cam{i:02d}": 0 for i in range(k)}
    for d in dets:
        gaps[d.stream] = gaps.get(d.stream, 0) + d.dropped_before
    last_dropped = {s.stream: s.dropped for s in run.statuses}
    drops = sum(max(count, last_dropped.get(cam, 0)) for cam, count in gaps.items())
    span = max(d.captured_at for d in steady) - t0 if steady else 0.0
    return LiveRun(engine=dets[0].engine, published_fps=len(steady) / span if span > 0 else 0.0,
                   p50_ms=float(np.percentile(latencies, 50)) if steady else None,
                   p99_ms=float(np.percentile(latencies, 99)) if steady else None,
                   drops=drops, peak_rss_mb=run.peak_rss_mb, running_rss_mb=run.running_rss_mb)


def summarize_step(k: int, runs: list[LiveRun], settings: LiveSettings) -> LiveStep:
    p99 = Spread.of([r.p99_ms for r in runs], 1)
    passed = all(r.drops == 0 for r in runs) and p99.median is not None and p99.median <= settings.p99_bound_ms
    return LiveStep(k=k, demand_fps=round(k * settings.fps, 1),
                    published_fps=Spread.of([r.published_fps for r in runs], 1),
                    p50_ms=Spread.of([r.p50_ms for r in runs], 1), p99_ms=p99,
                    drops=Spread.of([r.drops for r in runs], 0),
                    peak_rss_mb=Spread.of([r.peak_rss_mb for r in runs], 1),
                    running_rss_mb=Spread.of([r.running_rss_mb for r in runs], 1), passed=passed)


def live_search(settings: LiveSettings, ks: list[int], repeats: int, cache: RunCache, precision: Precision,
                clip: str) -> Live:
    """K upward (``ks``) until the first K that fails; every run is kept in ``cache``."""
    steps: list[LiveStep] = []
    for k in sorted(set(ks)):
        runs = [run_live_once(settings, k) for _ in range(repeats)]
        cache.setdefault(k, []).extend(runs)
        steps.append(summarize_step(k, runs, settings))
        if not steps[-1].passed:
            break
    passing = [step.k for step in steps if step.passed]
    engine = next(iter(cache.values()))[0].engine
    return Live(precision=precision, clip=clip, engine=engine, fps_per_camera=settings.fps,
                duration_s=settings.duration_s, p99_bound_ms=settings.p99_bound_ms, steps=steps,
                max_cameras=max(passing) if passing else 0)


def run_memory(settings: LiveSettings, low_k: int, high_k: int, repeats: int, cache: RunCache,
               precision: Precision) -> Memory:
    """Resident memory at ``low_k`` and ``high_k`` cameras, reusing the runs the search already made."""
    for k in (low_k, high_k):
        for _ in range(max(0, repeats - len(cache.get(k, [])))):
            cache.setdefault(k, []).append(run_live_once(settings, k))
    low, high = cache[low_k], cache[high_k]
    running_low = Spread.of([r.running_rss_mb for r in low], 1)
    running_high = Spread.of([r.running_rss_mb for r in high], 1)
    per_camera = None
    if running_low.median and running_high.median and high_k > low_k:
        per_camera = round((running_high.median - running_low.median) / (high_k - low_k), 1)
    return Memory(precision=precision, low_k=low_k, high_k=high_k,
                  peak_rss_mb_low=Spread.of([r.peak_rss_mb for r in low], 1),
                  peak_rss_mb_high=Spread.of([r.peak_rss_mb for r in high], 1),
                  running_rss_mb_low=running_low, running_rss_mb_high=running_high, rss_per_camera_mb=per_camera)
