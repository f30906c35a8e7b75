"""The benchmark run: resolve model and clips once, run the selected sections, collect one result tree.

Runs on the main thread of ``detstream bench``. A section that fails is
recorded under ``errors`` with its reason and the others still run; the exit
code then says so.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.bench import clips as clip_tools
from app.bench.arithmetic import conv_gflop, one_thread_sgemm_gflops
from app.bench.common import stat, wait_for_quiet
from app.bench.file_mode import run_file_once, summarize_file
from app.bench.live_mode import LiveSettings, live_overload, live_search, overload_k
from app.bench.machine import machine_info
from app.bench.memory import run_memory
from app.bench.model_only import load_frames, measure_round, postprocess_timing, prepare, summarize
from app.bench.naive import naive_loop
from app.bench.workers import apply_overrides

logger = logging.getLogger(__name__)

SECTIONS = ("model", "naive", "file", "live", "memory")
MODEL_BATCHES = [1, 2, 4, 8]


@dataclass
class Plan:
    """Everything the options decide, with ``--quick`` already applied."""

    quick: bool
    sections: list[str]
    clips: list[str]
    live_clip: str
    model: str
    models_dir: Path
    backend: str
    repeats: int
    max_frames: int | None
    model_seconds: float
    frames_in_memory: int
    cameras: list[int]
    target_k: int
    memory_ks: tuple[int, int]
    live_duration_s: float
    live_fps: float
    live_phase: str
    overload: bool
    overload_k: int | None
    int8: bool
    settle_s: float
    cache_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What sections share: the resolved model, the engine config, clips, and live runs already made."""

    plan: Plan
    spec: Any = None
    model_path: Path | None = None
    config: Any = None
    clips: dict[str, Path] = field(default_factory=dict)
    live_runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def add_arithmetic_rate(summary: dict[str, Any], model_path: str) -> None:
    """Model-only's GFLOP per frame and, per batch size, GFLOP/s per core of CPU (CPU providers only).

    CPU ms per frame is the whole process's CPU over the frames, so GFLOP / CPU-second is the rate of
    one busy core, the figure to set against the machine's one-thread SGEMM.
    """
    try:
        gflop = conv_gflop(model_path, *summary["input_hw"])
    except Exception as error:  # a model whose convolutions shape inference cannot size: no rate, no failure
        logger.info("bench: no GFLOP count for %s: %s", model_path, error)
        return
    summary["gflop_per_frame"] = round(gflop, 3)
    for entry in summary["batches"].values():
        cpu_ms = entry["cpu_ms_per_frame"]["median"]
        entry["gflops_per_core"] = round(gflop / (cpu_ms / 1e3), 1) if cpu_ms else None


def new_results(plan: Plan) -> dict[str, Any]:
    machine = machine_info()
    if "model" in plan.sections:  # the core's fp32 peak, to read model-only's GFLOP/s against
        machine["sgemm_gflops_one_thread"] = one_thread_sgemm_gflops()
    return {"schema": "detstream.bench/1", "started_at": round(time.time(), 3), "quick": plan.quick,
            "machine": machine, "errors": {}}


def run_suite(plan: Plan, results: dict[str, Any]) -> dict[str, Any]:
    """Fill ``results`` section by section (so that an interrupted run still has what it measured)."""
    started = results["started_at"]
    ctx = Context(plan)
    _section(results, "setup", lambda: _setup(ctx, results))
    if "setup" in results["errors"]:
        return results
    if {"model", "naive", "file"} & set(plan.sections):
        _Throughput(ctx, results).run()
    for key, name, fn in (("live", "live", _live), ("memory", "memory", _memory)):
        if key in plan.sections:
            _section(results, name, lambda fn=fn: fn(ctx, results))
    if plan.int8:
        from app.bench.int8 import run_int8

        _section(results, "int8", lambda: run_int8(ctx, results))
    results["ratios"] = ratios(results)
    results["elapsed_s"] = round(time.time() - started, 1)
    return results


def _section(results: dict[str, Any], name: str, fn) -> None:
    logger.info("bench: %s", name)
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as error:  # one section's failure is reported, the rest of the suite still runs
        logger.error("bench: %s failed: %s", name, error)
        logger.debug("%s", traceback.format_exc())
        results["errors"][name] = f"{type(error).__name__}: {error}"
        return
    if value is not None:
        results[name] = value
    logger.info("bench: %s done in %.1f s", name, time.monotonic() - t0)


def _setup(ctx: Context, results: dict[str, Any]) -> None:
    from app.config import parse_config
    from app.pipeline import load_spec

    plan = ctx.plan
    for name in dict.fromkeys([*plan.clips, plan.live_clip]):
        ctx.clips[name] = clip_tools.resolve_clip(name)
    looks_like_path = plan.model.endswith(".onnx") or "/" in plan.model
    tree = {"sources": [{"url": str(ctx.clips[plan.clips[0]])}],
            "model": {"path": str(Path(plan.model).resolve())} if looks_like_path else {"name": plan.model},
            "engine": {"backend": plan.backend}}
    ctx.config = parse_config(apply_overrides(tree, {k: v for k, v in plan.overrides.items()
                                                     if k.startswith(("engine.", "model."))}), env={})
    ctx.spec = load_spec(ctx.config, plan.models_dir, None)
    ctx.model_path = Path(ctx.spec.path).resolve()
    results["model"] = {"name": ctx.spec.name, "path": str(ctx.model_path), "input": [ctx.spec.input_height,
                        ctx.spec.input_width], "layout": ctx.spec.layout, "sha256": ctx.spec.sha256[:16],
                        "conf_threshold": ctx.config.model.conf_threshold,
                        "iou_threshold": ctx.config.model.iou_threshold}
    results["engine_config"] = ctx.config.engine.model_dump(mode="json")
    results["options"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.__dict__.items()}


class _Throughput:
    """Sections model, naive and file, interleaved: each repeat runs all three, so drifting load hits all alike.

    Model-only runs on every clip: with rectangular inputs each clip has its own input size, hence its own
    ceiling (vtest 416x320, bikes 416x192), and each clip's e2e is paired with its own.
    """

    def __init__(self, ctx: Context, results: dict[str, Any]) -> None:
        self.ctx, self.results, self.plan = ctx, results, ctx.plan
        self.kinds = [k for k in ("model", "naive", "file") if k in self.plan.sections]
        self.engine = None
        self.rect = False
        self.in_flight = 1
        self.frames: dict[str, list] = {}
        self.boxes: dict[str, list] = {}
        self.sizes: list[int] = []
        self.model_rounds: dict[str, list[dict[str, Any]]] = {}
        self.naive_runs: dict[str, list[dict[str, Any]]] = {}
        self.file_runs: dict[str, list[dict[str, Any]]] = {}

    def run(self) -> None:
        """Per repeat and per clip, back to back: model-only, file mode, naive.

        The ratios pair runs of one clip seconds apart: the host under this VM drifts by 10-20 % over
        minutes (the same model-only run measured 41 and 46 ms per frame an hour apart), and a file run
        a minute after its model-only run paired that drift into the ratio.
        """
        try:
            self._guard("model_only", self._open_engine, "model")
            for _ in range(self.plan.repeats):
                for name in self.plan.clips:
                    self._guard("model_only", lambda name=name: self._model_round(name), "model")
                    self._guard("file", lambda name=name: self._file_round(name), "file")
                    self._guard("naive", lambda name=name: self._naive_round(name), "naive")
            self._guard("model_only", self._finish_model, "model")
        finally:
            if self.engine is not None:
                self.engine.close()
        if self.model_rounds and "model" in self.kinds:
            self.results["model_only_by_clip"] = {
                label: self._model_summary(label, rounds) for label, rounds in self.model_rounds.items()}
        if self.naive_runs and "naive" in self.kinds:
            self.results["naive"] = {label: _naive_summary(runs) for label, runs in self.naive_runs.items()}
        if self.file_runs and "file" in self.kinds:
            self.results["file"] = {label: summarize_file(runs) for label, runs in self.file_runs.items()}
        self.results["ratios_per_round"] = paired_ratios(self.model_rounds, self.naive_runs, self.file_runs)

    def _guard(self, name: str, fn, kind: str) -> None:
        if kind not in self.kinds:
            return
        try:
            fn()
        except Exception as error:  # this kind is reported failed; the other kinds go on
            logger.error("bench: %s failed: %s", name, error)
            logger.debug("%s", traceback.format_exc())
            self.results["errors"][name] = f"{type(error).__name__}: {error}"
            self.kinds.remove(kind)

    def _open_engine(self) -> None:
        from app.engines import create_engine
        from app.pipeline import in_flight_batches, use_rect

        self.engine = create_engine(self.ctx.spec, self.ctx.config.engine)  # warmed up
        self.rect = use_rect(self.ctx.config, self.engine)
        self.in_flight = in_flight_batches(self.ctx.config) + 1  # the queue, plus the batch being postprocessed
        for name in self.plan.clips:
            label = clip_tools.clip_label(name)
            self.frames[label], self.boxes[label] = load_frames(str(self.ctx.clips[name]), self.plan.frames_in_memory,
                                                                self.ctx.spec, self.rect)
        self.sizes = prepare(self.engine, next(iter(self.frames.values())), MODEL_BATCHES)

    def _model_round(self, name: str) -> None:
        label = clip_tools.clip_label(name)
        frames = self.frames[label]
        rounds = self.model_rounds.setdefault(label, [])
        logger.info("bench: model-only on %s (%dx%d), round %d", label, *frames[0].shape[1:], len(rounds) + 1)
        wait_for_quiet(self.plan.settle_s)
        rounds.append(measure_round(self.engine, frames, self.sizes, self.plan.model_seconds, in_flight=self.in_flight))

    def _model_summary(self, label: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
        frames = self.frames[label]
        out = summarize(rounds, self.engine.backend, len(frames), self.plan.model_seconds, self.engine.batch_sizes)
        out.update(clip=label, input_hw=list(frames[0].shape[1:]), rect=self.rect, in_flight=self.in_flight)
        if self.engine.backend.endswith("CPUExecutionProvider"):
            add_arithmetic_rate(out, self.ctx.spec.path)
        return out

    def _finish_model(self) -> None:
        label = next(iter(self.model_rounds))
        out = self._model_summary(label, self.model_rounds[label])
        model = self.ctx.config.model
        out["postprocess"] = postprocess_timing(self.engine, self.frames[label], self.boxes[label], self.ctx.spec,
                                                model.conf_threshold, model.iou_threshold, model.max_detections)
        self.results["model_only"] = out

    def _naive_round(self, name: str) -> None:
        model = self.ctx.config.model
        providers = naive_providers(self.engine.backend if self.engine else "")
        logger.info("bench: naive loop on %s", name)
        wait_for_quiet(self.plan.settle_s)
        run = naive_loop(str(self.ctx.clips[name]), str(self.ctx.model_path), providers, model.conf_threshold,
                         model.iou_threshold, self.plan.max_frames,
                         input_size=(self.ctx.spec.input_height, self.ctx.spec.input_width))
        run["providers"] = providers
        self.naive_runs.setdefault(clip_tools.clip_label(name), []).append(run)

    def _file_round(self, name: str) -> None:
        plan = self.plan
        clip = self.ctx.clips[name]
        if plan.max_frames is not None:
            clip = clip_tools.head_copy(clip, plan.max_frames, plan.cache_dir)
        label = clip_tools.clip_label(name)
        logger.info("bench: file mode on %s", name)
        run = run_file_once(clip, label, self.ctx.model_path, plan.backend, plan.overrides,
                            120 + 2 * (plan.max_frames or 2000), plan.settle_s)
        self.file_runs.setdefault(label, []).append(run)


def _naive_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"fps": stat([r["fps"] for r in runs]), "frames": runs[-1]["frames"],
            "detections_per_frame": runs[-1]["detections_per_frame"], "providers": runs[-1]["providers"],
            "background_cores": stat([r["background_cores"] for r in runs])}


def naive_providers(engine_backend: str) -> list[str]:
    """The tutorial's providers: the GPU when the pipeline's engine used one, else the CPU."""
    if "CUDA" in engine_backend or "Tensorrt" in engine_backend or engine_backend.startswith("tensorrt"):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def best_batch(rounds: list[dict[str, Any]]) -> int:
    """The batch size that is best by median over all repeats (not each repeat's own best, which would
    favour whichever size happened to get a lucky run)."""
    sizes = list(rounds[0]["fps"])
    return max(sizes, key=lambda b: float(np.median([r["fps"][b] for r in rounds])))


def pipeline_batch(rounds: list[dict[str, Any]], runs: list[dict[str, Any]]) -> int:
    """The measured batch size nearest (in ratio) to the mean batch the file runs published (ties: the larger)."""
    mean_batch = float(np.mean([r["mean_batch"] for r in runs])) or 1.0
    return min(rounds[0]["fps"], key=lambda b: (abs(np.log2(b / mean_batch)), -b))


def paired_ratios(model_rounds: dict[str, list[dict[str, Any]]], naive_runs: dict[str, list[dict[str, Any]]],
                  file_runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per clip and per repeat: file fps over the same repeat's model-only (on that clip) and naive fps.

    Model-only is taken, as the issue defines the ceiling, at the batch size the pipeline ran
    (:func:`pipeline_batch`); the ratio to the best batch size by median is kept beside it
    (``e2e_over_model_only_best``). With per-frame CPU runs the sizes are equal within noise, and a best of
    four noisy medians is biased upwards.
    """
    out: dict[str, dict[str, Any]] = {}
    for label, runs in file_runs.items():
        entry: dict[str, Any] = {}
        rounds = model_rounds.get(label)
        if rounds:
            used, best = pipeline_batch(rounds, runs), best_batch(rounds)
            entry["model_only_batch"], entry["model_only_best_batch"] = used, best
            entry["e2e_over_model_only"] = [round(f["fps"] / m["fps"][used], 3)
                                            for f, m in zip(runs, rounds, strict=False)]
            entry["e2e_over_model_only_best"] = [round(f["fps"] / m["fps"][best], 3)
                                                 for f, m in zip(runs, rounds, strict=False)]
        naive = naive_runs.get(label, [])
        if naive:
            entry["e2e_over_naive"] = [round(f["fps"] / n["fps"], 3) for f, n in zip(runs, naive, strict=False)]
        out[label] = entry
    return out


def live_settings(ctx: Context) -> LiveSettings:
    plan = ctx.plan
    clip = ctx.clips[plan.live_clip]
    fps = plan.live_fps
    frames = math.ceil((plan.live_duration_s + 10) * fps)
    if plan.live_phase == "sync":
        def cameras(k: int) -> list[Path]:
            return [clip] * k
    else:
        def cameras(k: int) -> list[Path]:
            return clip_tools.camera_clips(clip, k, round(fps), plan.cache_dir, frames)
    staleness = float(plan.overrides.get("source.max_staleness_ms", 500.0))
    return LiveSettings(cameras, ctx.model_path, plan.backend, fps, plan.live_duration_s, staleness,
                        {k: v for k, v in plan.overrides.items() if k != "source.max_staleness_ms"}, plan.settle_s)


def capacity_fps(results: dict[str, Any]) -> tuple[float, str]:
    """The pipeline's capacity for the overload run: file-mode fps if measured, else the model-only ceiling."""
    for label, entry in results.get("file", {}).items():
        if entry.get("fps", {}).get("median"):
            return entry["fps"]["median"], f"file mode on {label}"
    best = results.get("model_only", {}).get("best_fps", {}).get("median")
    if best:
        return best, "model-only ceiling"
    raise RuntimeError("the overload run needs a capacity: run it together with file or model")


def batch_ms(results: dict[str, Any], max_batch: int) -> float:
    batches = results.get("model_only", {}).get("batches", {})
    sizes = [int(b) for b in batches if int(b) <= max_batch]
    if not sizes:
        return 0.0
    return batches[str(max(sizes))]["ms_per_batch"]["median"]


def _live(ctx: Context, results: dict[str, Any]) -> None:
    """The K search, stored as soon as it is done; then the overload run (its failure keeps the search)."""
    plan = ctx.plan
    settings = live_settings(ctx)
    out = live_search(settings, plan.cameras, plan.target_k, plan.repeats, ctx.live_runs)
    out["phase"] = plan.live_phase
    out["clip"] = plan.live_clip
    results["live"] = out
    if plan.overload:
        _section(results, "live_overload", lambda: _overload(ctx, results, settings))


def _overload(ctx: Context, results: dict[str, Any], settings: LiveSettings) -> None:
    plan = ctx.plan
    if plan.overload_k:
        k = plan.overload_k
        capacity, basis = capacity_fps(results) if _has_capacity(results) else (0.0, "not measured (--overload-k)")
    else:
        capacity, basis = capacity_fps(results)
        k = overload_k(capacity, settings.fps)
    one_batch = batch_ms(results, ctx.config.engine.max_batch)
    overload = live_overload(settings, k, capacity, one_batch, ctx.config.engine.max_wait_ms, plan.repeats,
                             ctx.live_runs)
    overload["capacity_basis"] = basis
    results["live"]["overload"] = overload


def _has_capacity(results: dict[str, Any]) -> bool:
    try:
        capacity_fps(results)
    except RuntimeError:
        return False
    return True


def _memory(ctx: Context, results: dict[str, Any]) -> dict[str, Any]:
    plan = ctx.plan
    low, high = plan.memory_ks
    from app.pipeline import ring_slots

    engine, spec = ctx.config.engine, ctx.spec
    slot_mb = 3 * spec.input_height * spec.input_width * 4 / 2**20  # float32 (3, H, W) at the model's full input

    def ring_mb(streams: int) -> float:
        return ring_slots(streams, engine, engine.max_batch)[0] * slot_mb

    return run_memory(live_settings(ctx), low, high, plan.repeats, ctx.live_runs, ring_mb)


def ratios(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per clip: file-mode e2e fps over the model-only ceiling and over the naive loop.

    The figure is the median of the per-repeat ratios (each repeat ran model-only,
    naive and file mode back to back); the ratio of the medians is given too.
    """
    out: dict[str, dict[str, Any]] = {}
    per_round = results.get("ratios_per_round", {})
    for label, entry in results.get("file", {}).items():
        paired_entry = per_round.get(label, {})
        batches = results.get("model_only_by_clip", {}).get(label, {}).get("batches", {})
        used, best = paired_entry.get("model_only_batch"), paired_entry.get("model_only_best_batch")
        e2e = entry["fps"]["median"]
        ratio: dict[str, Any] = {"model_only_batch": used, "model_only_best_batch": best}
        naive = results.get("naive", {}).get(label, {}).get("fps", {}).get("median")
        for key, reference in (("e2e_over_model_only", _median_fps(batches, used)),
                               ("e2e_over_model_only_best", _median_fps(batches, best)),
                               ("e2e_over_naive", naive)):
            paired = paired_entry.get(key)
            if paired:
                ratio[key] = stat(paired, 3)
                ratio[key + "_of_medians"] = round(e2e / reference, 3) if reference else None
        out[label] = ratio
    return out


def _median_fps(batches: dict[str, Any], size: int | None) -> float | None:
    return batches.get(str(size), {}).get("fps", {}).get("median") if size is not None else None
