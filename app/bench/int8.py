"""``--int8``: the INT8 model next to fp32, model-only and in file mode, with its agreement with fp32.

The INT8 model is ``<model>-int8.onnx`` beside the fp32 one, made with
:func:`app.models.quantize.quantize_model` (calibrated on frames spread over
the first clip) when it is missing or stale (made from another fp32 file).
Agreement is :func:`app.models.agreement.detection_agreement`: frames the
calibration skipped, letterboxed as the pipeline feeds them, detections of both
models matched greedily by score (same class, IoU >= 0.5), F1 = 2PR / (P + R)
with fp32 as the reference.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.bench import clips as clip_tools
from app.bench.common import stat, wait_for_quiet
from app.bench.file_mode import run_file_mode
from app.bench.model_only import load_frames, measure_round, prepare, summarize

logger = logging.getLogger(__name__)

CALIBRATION_FRAMES = 100
AGREEMENT_FUNCTIONS = ("detection_agreement", "agreement", "f1_agreement", "compare_models")


def int8_path(model_path: Path) -> Path:
    return model_path.with_name(f"{model_path.stem}-int8.onnx")


def ensure_int8(model_path: Path, calib: Path, frames: int) -> Path:
    """``<model>-int8.onnx``, quantized now when missing or made from another fp32 file (e.g. an older converter)."""
    from app.models.provenance import stale_int8_reason
    from app.models.quantize import quantize_model

    path = int8_path(model_path)
    if path.exists():
        stale = stale_int8_reason(path, model_path)
        if stale is None:
            return path
        logger.info("bench: %s is stale (%s): quantizing again", path.name, stale)
    logger.info("bench: quantizing %s on %d frames of %s", model_path.name, frames, calib.name)
    return Path(quantize_model(model_path, calib, path, frames=frames))


def agreement(fp32_model: Path, int8_model: Path, clip: Path, count: int, calibration_frames: int) -> dict[str, Any]:
    """F1 of INT8 against fp32 on ``count`` frames of ``clip`` that calibration skipped."""
    from app.models.agreement import detection_agreement

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
    out.update(agreement(ctx.model_path, model, clip, 12 if plan.quick else 60, calib_frames))
    return out
