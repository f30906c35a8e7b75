"""``--int8``: the INT8 model next to fp32, model-only and in file mode, with its agreement with fp32.

The INT8 model is ``<model>-int8.onnx`` beside the fp32 one, made with
:func:`app.models.quantize.quantize_model` (calibrated on frames spread over
the first clip) when it is missing or stale (made from another fp32 file).
Agreement is :func:`app.models.agreement.detection_agreement`: frames the
calibration skipped, letterboxed as the pipeline feeds them, detections of both
models matched greedily by score (same class, IoU >= 0.5), F1 = 2PR / (P + R)
with fp32 as the reference.

Agreement is reported for every clip, twice: with the bench's model (calibrated
on the first clip), and with a model calibrated on that clip's own footage, as
``detstream quantize --calib`` tells users to do. The second is what the F1
target is held to; the first shows what calibrating on other footage costs
(bikes calibrated on vtest: F1 about 0.91). Those per-clip models live in the
bench cache, named after the clip, so a second run does not quantize again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.bench import clips as clip_tools
from app.bench.common import stat, wait_for_quiet
from app.bench.file_mode import run_file_mode
from app.bench.model_only import load_frames, measure_round, prepare, summarize
from app.models.store.provenance import calibration_of, stale_int8_reason

logger = logging.getLogger(__name__)

CALIBRATION_FRAMES = 100
AGREEMENT_FUNCTIONS = ("detection_agreement", "agreement", "f1_agreement", "compare_models")


def int8_path(model_path: Path) -> Path:
    return model_path.with_name(f"{model_path.stem}-int8.onnx")


def ensure_int8(model_path: Path, calib: Path, frames: int) -> Path:
    """``<model>-int8.onnx``, quantized now when missing or made from another fp32 file (e.g. an older converter)."""
    from app.models.quantization.quantize import quantize_model

    path = int8_path(model_path)
    if path.exists():
        stale = stale_int8_reason(path, model_path)
        if stale is None:
            return path
        logger.info("bench: %s is stale (%s): quantizing again", path.name, stale)
    logger.info("bench: quantizing %s on %d frames of %s", model_path.name, frames, calib.name)
    return Path(quantize_model(model_path, calib, path, frames=frames))


def own_calibration_model(model_path: Path, clip: Path, frames: int, cache_dir: Path) -> Path:
    """An INT8 model of ``model_path`` calibrated on ``frames`` frames of ``clip`` itself, kept in ``cache_dir``.

    Re-made when the cached one is stale against ``model_path`` (another fp32 file or quantizer version); the
    name carries the clip's path, size and mtime, so another clip of the same name gets its own file. (The
    cache's pruning deletes clip copies only; these few files stay.)
    """
    from app.models.quantization.quantize import quantize_model

    path = cache_dir / clip_tools.cache_name(clip, f"{model_path.stem}-int8-calib{frames}", ".onnx")
    if path.exists() and stale_int8_reason(path, model_path) is None:
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    logger.info("bench: quantizing %s on %d frames of %s, for agreement on its own footage", model_path.name,
                frames, clip.name)
    return Path(quantize_model(model_path, clip, path, frames=frames))


def agreement_by_clip(fp32_model: Path, bench_model: Path, clips: dict[str, Path], count: int,
                      calibration_frames: int, cache_dir: Path) -> dict[str, dict[str, Any]]:
    """Per clip label: agreement of the bench's INT8 model and of one calibrated on that clip itself, on the same
    held-out frames of that clip. Which footage the bench's model was calibrated on is read from the file
    (``detstream.calibrated_on``), not assumed: an older file that does not say is "unknown"."""
    recorded = calibration_of(bench_model)
    bench_calibrated_on = recorded[0] if recorded else "unknown"
    out: dict[str, dict[str, Any]] = {}
    for label, clip in clips.items():
        bench = {"calibrated_on": bench_calibrated_on,
                 **agreement(fp32_model, bench_model, clip, count, calibration_frames)}
        if recorded == (clip.name, calibration_frames):  # else its calibration frames are not the ones held out
            own = bench
        else:
            own_model = own_calibration_model(fp32_model, clip, calibration_frames, cache_dir)
            own = {"calibrated_on": clip.name, "model": str(own_model),
                   **agreement(fp32_model, own_model, clip, count, calibration_frames)}
        out[label] = {"own_calibration": own, "bench_model": bench}
    return out


def agreement(fp32_model: Path, int8_model: Path, clip: Path, count: int, calibration_frames: int) -> dict[str, Any]:
    """F1 of INT8 against fp32 on ``count`` frames of ``clip`` that calibration skipped."""
    from app.models.quantization.agreement import detection_agreement

    result = detection_agreement(fp32_model, int8_model, clip, frames=count, calibration_frames=calibration_frames)
    return {**result, "method": "app.models.agreement.detection_agreement: frames between the calibration frames, "
                                "inputs as the pipeline feeds them; greedy match, same class, IoU >= 0.5"}


def run_int8(ctx: Any, results: dict[str, Any]) -> dict[str, Any]:
    from app.config import parse_config
    from app.engines import create_engine
    from app.pipeline import in_flight_batches, load_spec, use_rect

    plan = ctx.plan
    clip = ctx.clips[plan.clips[0]]
    calib_frames = 20 if plan.quick else CALIBRATION_FRAMES
    model = ensure_int8(ctx.model_path, clip, calib_frames)
    tree = ctx.config.model_dump(mode="json", exclude_unset=True)
    tree["model"] = {**tree.get("model", {}), "path": str(model), "name": None}
    spec = load_spec(parse_config(tree, env={}), plan.models_dir, None)
    engines = {"fp32": create_engine(ctx.spec, ctx.config.engine), "int8": create_engine(spec, ctx.config.engine)}
    rounds: dict[str, list[dict[str, Any]]] = {"fp32": [], "int8": []}
    in_flight = in_flight_batches(ctx.config) + 1
    try:
        # Both models on the same frames: rectangular only when the pipeline would run both that way.
        rect = all(use_rect(ctx.config, engine) for engine in engines.values())
        frames, _ = load_frames(str(clip), plan.frames_in_memory, spec, rect)
        sizes = {name: prepare(engine, frames, [1, 2, 4, 8]) for name, engine in engines.items()}
        for _ in range(plan.repeats):  # fp32 and int8 back to back in every round: the speedup is paired
            for name, engine in engines.items():
                wait_for_quiet(plan.settle_s)
                rounds[name].append(measure_round(engine, frames, sizes[name], plan.model_seconds,
                                                  in_flight=in_flight))
    finally:
        for engine in engines.values():
            engine.close()
    model_only = summarize(rounds["int8"], engines["int8"].backend, len(frames), plan.model_seconds)
    fp32_same_rounds = summarize(rounds["fp32"], engines["fp32"].backend, len(frames), plan.model_seconds)
    best_int8, best_fp32 = model_only["best_batch"], fp32_same_rounds["best_batch"]
    paired = [i["fps"][best_int8] / f["fps"][best_fp32] for i, f in zip(rounds["int8"], rounds["fp32"], strict=True)]
    out: dict[str, Any] = {"model": str(model), "clip": clip_tools.clip_label(plan.clips[0]),
                           "input_hw": list(frames[0].shape[1:]),
                           "engine": model_only["engine"], "model_only": model_only,
                           "fp32_model_only_same_rounds": fp32_same_rounds,
                           "speedup_model_only": stat(paired, 3)["median"], "speedup_model_only_runs": stat(paired, 3),
                           "speedup_by_batch": {
                               b: round(entry["fps"]["median"] / fp32_same_rounds["batches"][b]["fps"]["median"], 3)
                               for b, entry in model_only["batches"].items()}}
    if "file" in plan.sections:
        out["file"] = {}
        for name in plan.clips:
            label = clip_tools.clip_label(name)
            source = ctx.clips[name]
            if plan.max_frames is not None:
                source = clip_tools.head_copy(source, plan.max_frames, plan.cache_dir)
            out["file"][label] = run_file_mode(source, label, model, plan.backend, plan.overrides, plan.repeats,
                                               120 + 2 * (plan.max_frames or 2000), plan.settle_s)
            fp32_file = results.get("file", {}).get(label, {}).get("fps", {}).get("median")
            if fp32_file:
                out["file"][label]["speedup_vs_fp32"] = round(out["file"][label]["fps"]["median"] / fp32_file, 3)
    count = 12 if plan.quick else 60
    labelled = {clip_tools.clip_label(name): ctx.clips[name] for name in plan.clips}
    out["agreement_by_clip"] = agreement_by_clip(ctx.model_path, model, labelled, count, calib_frames,
                                                 plan.cache_dir)
    # the agreement keys results had before per-clip agreement; the section's own keys ("clip": the label) win
    return {**out["agreement_by_clip"][clip_tools.clip_label(plan.clips[0])]["bench_model"], **out}
