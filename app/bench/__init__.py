"""``detstream bench``: the benchmarks of BENCHMARKS.md, in one process tree on one machine.

Sections (``--only``): ``model`` (the engine alone on frames in memory, the
ceiling), ``naive`` (the tutorial loop), ``file`` (``detstream run`` on a
clip, end to end), ``live`` (K simulated cameras: latency, drops, largest K
without drops, a 2× overload run), ``memory`` (peak RSS at 1 and 8 streams).
``--int8`` adds the INT8 model. Prints tables and writes the whole result
tree as JSON (default ``bench-results/bench-<timestamp>.json``).

Modules: :mod:`.machine`, :mod:`.model_only`, :mod:`.naive`,
:mod:`.file_mode`, :mod:`.live_mode`, :mod:`.memory`, :mod:`.int8`,
:mod:`.report`; :mod:`.suite` runs them, :mod:`.common` has the worker
subprocess and the subscriber, :mod:`.clips` the clips and cameras.
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
                   help="CI smoke: 1 repeat, 40 frames, K in {1,2}, short live runs (numbers are not meaningful)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="runs per figure; the median is reported")
    p.add_argument("--clip", default="vtest", metavar="vtest|bikes|PATH[,...]",
                   help="clip(s) for model, naive and file (comma-separated)")
    p.add_argument("--live-clip", default="vtest", metavar="vtest|bikes|PATH", help="clip the cameras replay")
    p.add_argument("--only", metavar="SECTIONS", help="comma-separated subset of model,naive,file,live,memory")
    p.add_argument("--int8", action="store_true", help="also benchmark the INT8 model (made if missing)")
    p.add_argument("--json", type=Path, metavar="PATH", help="default bench-results/bench-<timestamp>.json")
    p.add_argument("--model", default="yolov3-tiny", metavar="NAME_OR_PATH")
    p.add_argument("--models-dir", type=Path, default=Path("models"))
    p.add_argument("--engine", default="auto", choices=["auto", "tensorrt", "onnxruntime"])
    p.add_argument("--frames", type=int, metavar="N", help="use only the first N frames of each clip")
    p.add_argument("--model-seconds", type=float, default=4.0, metavar="S", help="length of one model-only run")
    p.add_argument("--cameras", default=DEFAULT_CAMERAS, metavar="K,K,...", help="live search steps")
    p.add_argument("--duration", type=float, default=15.0, metavar="S", help="length of one live run")
    p.add_argument("--camera-fps", type=float, default=5.0, metavar="FPS")
    p.add_argument("--live-phase", default="stagger", choices=["stagger", "sync"],
                   help="stagger: cameras deliver at independent instants (5 fps copies); "
                        "sync: every camera replays the clip decimated by max_fps, all in step (worst case)")
    p.add_argument("--no-overload", action="store_true", help="skip the 2x overload live run")
    p.add_argument("--overload-k", type=int, metavar="K", help="cameras in the overload run (default: 2x capacity)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every run, e.g. engine.max_wait_ms=5 or source.max_staleness_ms=300")
    p.add_argument("--settle", type=float, default=20.0, metavar="S",
                   help="before each run, wait up to S seconds for other processes to leave the CPU (0: never)")
    p.add_argument("--markdown", type=Path, metavar="JSON",
                   help="print the Markdown tables of an earlier result (for BENCHMARKS.md) and exit")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "detstream" / "bench",
                   help="shortened clips and camera copies (pruned to 2 GiB, least recently used first)")
    return p


def make_plan(opts: argparse.Namespace):
    from app.bench.suite import SECTIONS, Plan
    from app.bench.workers import parse_overrides

    sections = [s.strip() for s in opts.only.split(",")] if opts.only else list(SECTIONS)
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"--only: unknown section(s) {unknown} (use {','.join(SECTIONS)})")
    cameras = sorted({int(k) for k in opts.cameras.split(",") if k.strip()})
    quick = opts.quick
    return Plan(
        quick=quick,
        sections=sections,
        clips=[c.strip() for c in opts.clip.split(",") if c.strip()],
        live_clip=opts.live_clip,
        model=opts.model,
        models_dir=opts.models_dir,
        backend=opts.engine,
        repeats=1 if quick else max(1, opts.repeat),
        max_frames=40 if quick else opts.frames,
        model_seconds=0.5 if quick else opts.model_seconds,
        frames_in_memory=16 if quick else 64,
        cameras=[1, 2] if quick else cameras,
        target_k=2 if quick else 8,
        memory_ks=(1, 2) if quick else (1, 8),
        live_duration_s=2.5 if quick else opts.duration,
        live_fps=opts.camera_fps,
        live_phase=opts.live_phase,
        overload=not opts.no_overload,
        overload_k=opts.overload_k,
        int8=opts.int8,
        settle_s=0.0 if quick else opts.settle,
        cache_dir=opts.cache_dir.expanduser(),
        overrides=parse_overrides(opts.set),
    )


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def bench_command(args: list[str]) -> int:
    """Parse ``args`` (what follows ``detstream bench``), run, print, write JSON; 0 when every section ran."""
    from app.bench.report import print_report, targets, write_json
    from app.bench.suite import new_results, ratios, run_suite

    if args and args[0] == "--":
        args = args[1:]
    opts = build_parser().parse_args(args)
    if opts.markdown:
        import json

        from app.bench.report import markdown

        print(markdown(json.loads(opts.markdown.read_text())), end="")
        return 0
    try:
        plan = make_plan(opts)
    except ValueError as error:
        build_parser().error(str(error))
    results = new_results(plan)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM unwinds like Ctrl-C: workers are ended
    try:
        run_suite(plan, results)
    except KeyboardInterrupt as stop:
        logger.warning("bench interrupted (%s): writing what was measured", stop)
        results["interrupted"] = str(stop) or "interrupted"
        results["ratios"] = ratios(results)
    finally:
        signal.signal(signal.SIGTERM, previous)
    results["targets"] = targets(results)
    path = opts.json or Path("bench-results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    print_report(results)
    write_json(results, path)
    print(f"results: {path}")
    if "interrupted" in results:
        return 130
    return 1 if results["errors"] else 0


__all__ = ["bench_command", "build_parser"]
