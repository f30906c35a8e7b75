"""The bench run: resolve model and clips once, run the selected sections per precision, fill one result.

Runs on the main thread of ``detstream bench``. A section that fails is
recorded under ``errors`` with its reason and the others still run; the exit
code then says so. Sections fill the result as they finish, so an interrupted
run still has what it measured.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.bench import clips as clip_tools
from app.bench.file_mode import FileRun, run_file_once, summarize_file
from app.bench.live_mode import LiveSettings, RunCache, live_search, run_memory
from app.bench.model_only import accepted_sizes, load_frames, measure_round, summarize
from app.bench.naive import NaiveRun, naive_loop, naive_providers, summarize_naive
from app.bench.results import BenchResult, ModelInfo, Precision
from app.config import DetstreamConfig, parse_config
from app.engines import create_engine
from app.pipeline import load_spec
from app.types import ModelSpec

logger = logging.getLogger(__name__)

SECTIONS = ("model", "naive", "file", "live", "memory")


@dataclass
class Plan:
    """Everything the options decide, with ``--quick`` already applied."""

    quick: bool
    sections: list[str]
    clips: list[str]
    model: str
    models_dir: Path
    backend: str
    int8: bool
    repeats: int
    max_frames: int | None
    model_seconds: float
    frames_in_memory: int
    cameras: list[int]
    live_duration_s: float
    camera_fps: float
    p99_bound_ms: float
    cache_dir: Path
    engines: list[tuple[str, str]] | None = None
    """``--engines``: (backend, precision) pairs measured side by side; None: ``backend`` on fp32 (and int8)."""


@dataclass
class Variant:
    """One precision of the model (or one engine of ``--engines``): its file, its spec and the config
    ``detstream run`` would load for it; ``backend`` and ``engine_precision`` are passed to every run."""

    precision: Precision
    path: Path
    spec: ModelSpec
    config: DetstreamConfig
    backend: str = "auto"
    engine_precision: str | None = None
    naive: bool = False
    """Whether the naive loop runs for this variant (the first one: it is the same for all)."""
    live_runs: RunCache = field(default_factory=dict)
    engine: str = ""
    """The engine model-only ran on (``onnxruntime:CPUExecutionProvider``, ``tensorrt:fp16``), once known."""


def run_suite(plan: Plan, result: BenchResult) -> BenchResult:
    started = time.monotonic()
    clips: dict[str, Path] = {}
    variants: list[Variant] = []

    def setup() -> None:
        clips.update({name: clip_tools.resolve_clip(name) for name in plan.clips})
        variants.extend(_variants(plan, clips))

    _section(result, "setup", setup)
    result.models = [ModelInfo(name=v.spec.name, path=str(v.path), precision=v.precision,
                               input_hw=(v.spec.input_height, v.spec.input_width), layout=v.spec.layout)
                     for v in variants]
    naive: dict[str, float | None] = {}  # clip label → the naive loop's fps, for the file-mode ratio
    for v in variants:
        _run_variant(plan, clips, v, naive, result)
    result.elapsed_s = round(time.monotonic() - started, 1)
    return result


def _run_variant(plan: Plan, clips: dict[str, Path], v: Variant, naive: dict[str, float | None],
                 result: BenchResult) -> None:
    """The selected sections for one precision, in order; the naive loop (fp32 only) before file mode."""
    model_fps: dict[str, float | None] = {}
    label = clip_tools.clip_label(plan.clips[0])
    sections: list[tuple[str, str, Callable[[], object]]] = [
        ("model", f"model_only.{v.precision}", lambda: model_fps.update(_model_only(plan, clips, v, result))),
        ("naive", "naive", lambda: naive.update(_naive(plan, clips, v, result))),
        ("file", f"file.{v.precision}", lambda: _file(plan, clips, v, model_fps, naive, result)),
        ("live", f"live.{v.precision}", lambda: result.live.append(
            live_search(_live_settings(plan, clips, v), plan.cameras, plan.repeats, v.live_runs, v.precision, label))),
        ("memory", f"memory.{v.precision}", lambda: result.memory.append(
            run_memory(_live_settings(plan, clips, v), *memory_ks(plan, v), plan.repeats, v.live_runs, v.precision))),
    ]
    for key, name, fn in sections:
        if key in plan.sections and (key != "naive" or v.naive):
            _section(result, name, fn)


def memory_ks(plan: Plan, v: Variant) -> tuple[int, int]:
    """The fewest cameras asked for, and the most the live search ran (else asked for): no extra runs if it ran."""
    low = plan.cameras[0]
    high = max(v.live_runs, default=plan.cameras[-1])
    return low, max(high, low + 1)


def _section(result: BenchResult, name: str, fn: Callable[[], object]) -> None:
    logger.info("bench: %s", name)
    try:
        fn()
    except Exception as error:  # one section's failure is reported, the rest of the bench still runs
        logger.error("bench: %s failed: %s", name, error)
        logger.debug("%s", traceback.format_exc())
        result.errors[name] = f"{type(error).__name__}: {error}"


def _config(plan: Plan, clip: Path, model: str, backend: str | None = None,
            precision: str | None = None) -> DetstreamConfig:
    looks_like_path = model.endswith(".onnx") or "/" in model
    engine = {"backend": backend or plan.backend, **({"precision": precision} if precision else {})}
    tree = {"sources": [{"url": str(clip)}], "engine": engine,
            "model": {"path": str(Path(model).resolve())} if looks_like_path else {"name": model}}
    return parse_config(tree, env={})


def _variants(plan: Plan, clips: dict[str, Path]) -> list[Variant]:
    first = clips[plan.clips[0]]
    config = _config(plan, first, plan.model)
    spec = load_spec(config, plan.models_dir, None)
    if plan.engines:
        return _engine_variants(plan, first, spec)
    variants = [Variant("fp32", Path(spec.path).resolve(), spec, config, plan.backend, naive=True)]
    if plan.int8:
        from app.bench.int8 import ensure_int8

        path = ensure_int8(variants[0].path, first, 20 if plan.quick else 100)
        config = _config(plan, first, str(path))
        variants.append(Variant("int8", path, load_spec(config, plan.models_dir, None), config, plan.backend))
    return variants


def _engine_variants(plan: Plan, first: Path, spec: ModelSpec) -> list[Variant]:
    """One variant per ``--engines`` pair, all on the fp32 file: ``engine.precision: int8`` makes the engine load
    the INT8 model beside it (made here first when missing, as ``--int8`` does)."""
    path = Path(spec.path).resolve()
    if any(precision == "int8" for _, precision in plan.engines or []):
        from app.bench.int8 import ensure_int8

        ensure_int8(path, first, 20 if plan.quick else 100)
    variants = []
    for i, (backend, precision) in enumerate(plan.engines or []):
        label = "auto" if (backend, precision) == ("auto", "auto") else f"{backend}:{precision}"
        config = _config(plan, first, str(path), backend, precision)
        variants.append(Variant(label, path, spec, config, backend, precision, naive=i == 0))
    return variants


def _naive(plan: Plan, clips: dict[str, Path], v: Variant, result: BenchResult) -> dict[str, float | None]:
    providers = naive_providers(v.engine or v.backend)
    fps = {}
    for name, clip in clips.items():
        runs: list[NaiveRun] = [naive_loop(str(clip), str(v.path), providers, v.config.model.conf_threshold,
                                           v.config.model.iou_threshold, plan.max_frames,
                                           input_size=(v.spec.input_height, v.spec.input_width))
                                for _ in range(plan.repeats)]
        entry = summarize_naive(clip_tools.clip_label(name), providers, runs)
        result.naive.append(entry)
        fps[entry.clip] = entry.fps.median
    return fps


def _model_only(plan: Plan, clips: dict[str, Path], v: Variant, result: BenchResult) -> dict[str, float | None]:
    engine = create_engine(v.spec, v.config.engine)
    try:
        frames = {clip_tools.clip_label(name): load_frames(str(clip), plan.frames_in_memory, v.config, engine)
                  for name, clip in clips.items()}
        sizes = accepted_sizes(engine, next(iter(frames.values())))
        rounds: dict[str, list] = {label: [] for label in frames}
        for _ in range(plan.repeats):  # every clip in every repeat: drifting load hits all alike
            for label, clip_frames in frames.items():
                rounds[label].append(measure_round(engine, clip_frames, sizes, plan.model_seconds))
        entries = [summarize(rounds[label], v.precision, label, engine, frames[label]) for label in frames]
        v.engine = engine.backend
    finally:
        engine.close()
    result.model_only.extend(entries)
    return {entry.clip: entry.best_fps.median for entry in entries}


def _file(plan: Plan, clips: dict[str, Path], v: Variant, model_fps: dict[str, float | None],
          naive: dict[str, float | None], result: BenchResult) -> None:
    for name, clip in clips.items():
        label = clip_tools.clip_label(name)
        if plan.max_frames is not None:
            clip = clip_tools.head_copy(clip, plan.max_frames, plan.cache_dir)
        runs: list[FileRun] = [run_file_once(clip, label, v.path, v.backend, 120 + 2 * (plan.max_frames or 2000),
                                             v.engine_precision) for _ in range(plan.repeats)]
        result.file.append(summarize_file(v.precision, label, runs, model_fps.get(label),
                                          naive.get(label) if v.naive else None))


def _live_settings(plan: Plan, clips: dict[str, Path], v: Variant) -> LiveSettings:
    clip = clips[plan.clips[0]]
    frames = math.ceil((plan.live_duration_s + 10) * plan.camera_fps)

    def cameras(k: int) -> list[Path]:
        return clip_tools.camera_clips(clip, k, round(plan.camera_fps), plan.cache_dir, frames)

    return LiveSettings(cameras, v.path, v.backend, plan.camera_fps, plan.live_duration_s, plan.p99_bound_ms,
                        v.engine_precision)
