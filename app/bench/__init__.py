"""``detstream bench``: how many cameras of this kind this machine carries, on which backend and precision.

Sections (``--only``): ``model`` (the engine alone on frames in memory, the
ceiling), ``naive`` (the tutorial loop, the floor), ``file`` (``detstream
run`` on a clip, end to end), ``live`` (K simulated cameras: the largest K
with no drops and the p99 within ``--p99-ms``), ``memory`` (resident memory
with few and many cameras). ``--int8`` runs them again with the INT8 model;
``--engines`` runs them once per engine and precision instead, side by side.
Prints one table and writes the result as JSON (default
``bench-results/bench-<timestamp>.json``, see :mod:`app.bench.results`).

Modules: :mod:`.model_only`, :mod:`.naive`, :mod:`.file_mode`,
:mod:`.live_mode` (live and memory), :mod:`.int8`; :mod:`.suite` runs them,
:mod:`.worker` runs and watches one ``detstream run`` subprocess,
:mod:`.clips` makes the clips and cameras, :mod:`.report` prints and writes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_CAMERAS = "1,2,4,6,8,10,12"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="detstream bench", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 repeat, 40 frames, K in {1,2}, short live runs (numbers are not meaningful)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="runs per figure; the median is reported")
    p.add_argument("--clip", default="vtest", metavar="vtest|bikes|PATH[,...]",
                   help="clip(s) to measure on, comma-separated; the cameras replay the first")
    p.add_argument("--only", metavar="SECTIONS", help="comma-separated subset of model,naive,file,live,memory")
    p.add_argument("--int8", action="store_true", help="also run the INT8 model (made beside the fp32 one if missing)")
    p.add_argument("--json", type=Path, metavar="PATH", help="default bench-results/bench-<timestamp>.json")
    p.add_argument("--model", default="yolov3-tiny", metavar="NAME_OR_PATH")
    p.add_argument("--models-dir", type=Path, default=Path("models"))
    p.add_argument("--engine", default="auto", choices=["auto", "tensorrt", "onnxruntime", "openvino"])
    p.add_argument("--engines", metavar="BACKEND:PRECISION[,...]",
                   help="compare engines side by side on the same clips and frames, e.g. "
                        "onnxruntime:fp32,openvino:fp32,auto,onnxruntime:int8,openvino:int8 (replaces --engine/--int8)")
    p.add_argument("--frames", type=int, metavar="N", help="use only the first N frames of each clip")
    p.add_argument("--model-seconds", type=float, default=4.0, metavar="S", help="length of one model-only run")
    p.add_argument("--cameras", default=DEFAULT_CAMERAS, metavar="K,K,...", help="camera counts the search tries")
    p.add_argument("--duration", type=float, default=15.0, metavar="S", help="length of one live run")
    p.add_argument("--camera-fps", type=float, default=5.0, metavar="FPS", help="frame rate of each camera")
    p.add_argument("--p99-ms", type=float, default=150.0, metavar="MS",
                   help="latency bound of the capacity search (capture to publish, p99)")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "detstream" / "bench",
                   help="shortened clips and camera copies (pruned to 2 GiB, least recently used first)")
    return p


def make_plan(opts: argparse.Namespace):
    from app.bench.suite import SECTIONS, Plan

    sections = [s.strip() for s in opts.only.split(",")] if opts.only else list(SECTIONS)
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"--only: unknown section(s) {unknown} (use {','.join(SECTIONS)})")
    clips = [c.strip() for c in opts.clip.split(",") if c.strip()]
    if not clips:
        raise ValueError("--clip: name at least one clip")
    cameras = sorted({int(k) for k in opts.cameras.split(",") if k.strip()})
    if not cameras or cameras[0] < 1:
        raise ValueError("--cameras: camera counts are whole numbers >= 1")
    quick = opts.quick
    cameras = [1, 2] if quick else cameras
    engines = parse_engines(opts.engines) if opts.engines else None
    return Plan(
        quick=quick,
        sections=sections,
        clips=clips,
        model=opts.model,
        models_dir=opts.models_dir,
        backend=opts.engine,
        int8=opts.int8,
        repeats=1 if quick else max(1, opts.repeat),
        max_frames=40 if quick else opts.frames,
        model_seconds=0.5 if quick else opts.model_seconds,
        frames_in_memory=16 if quick else 64,
        cameras=cameras,
        live_duration_s=2.5 if quick else opts.duration,
        camera_fps=opts.camera_fps,
        p99_bound_ms=opts.p99_ms,
        cache_dir=opts.cache_dir.expanduser(),
        engines=engines,
    )


BACKEND_NAMES = ("auto", "tensorrt", "onnxruntime", "openvino")
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "int8")


def parse_engines(text: str) -> list[tuple[str, str]]:
    """``--engines``: ``BACKEND[:PRECISION]`` items (precision ``auto`` when left out); ValueError names a bad one."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        backend, _, precision = item.partition(":")
        precision = precision or "auto"
        if backend not in BACKEND_NAMES or precision not in PRECISIONS:
            raise ValueError(f"--engines: {item!r} is not BACKEND[:PRECISION] with BACKEND in {BACKEND_NAMES} and "
                             f"PRECISION in {PRECISIONS}")
        pairs.append((backend, precision))
    if not pairs:
        raise ValueError("--engines: name at least one engine")
    return pairs


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def bench_command(args: list[str]) -> int:
    """Parse ``args`` (what follows ``detstream bench``), run, print, write JSON; 0 when every section ran."""
    from app.bench.machine import machine_info
    from app.bench.report import print_report, write_json
    from app.bench.results import BenchResult
    from app.bench.suite import run_suite

    parser = build_parser()
    opts = parser.parse_args(args)
    try:
        plan = make_plan(opts)
    except ValueError as error:
        parser.error(str(error))
    result = BenchResult(started_at=round(time.time(), 3), quick=plan.quick, machine=machine_info())
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM unwinds like Ctrl-C: workers are ended
    try:
        run_suite(plan, result)
    except KeyboardInterrupt as stop:
        logger.warning("bench interrupted (%s): writing what was measured", stop)
        result.interrupted = str(stop) or "interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = opts.json or Path("bench-results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    print_report(result)
    write_json(result, path)
    print(f"results: {path}")
    if result.interrupted:
        return 130
    return 1 if result.errors else 0


__all__ = ["bench_command", "build_parser"]
