"""``--int8``: the INT8 model next to fp32, model-only and in file mode, with its agreement with fp32.

The INT8 model is ``<model>-int8.onnx`` beside the fp32 one, made with
:func:`app.models.quantize.quantize_model` (calibrated on the first frames of
the first clip) when it is not there yet. Agreement is measured on held-out
frames (after the calibration frames): when :mod:`app.models.quantize`
exposes an agreement function it is used; otherwise detections of both
models, decoded the pipeline's way, are matched greedily by score (same class,
IoU >= 0.5) and F1 = 2PR / (P + R), with fp32 as the reference.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from app.bench import clips as clip_tools
from app.bench.common import stat, wait_for_quiet
from app.bench.file_mode import run_file_mode
from app.bench.model_only import load_frames, measure_round, prepare, summarize
from app.postprocess.yolo import decode_batch
from app.types import Detections

logger = logging.getLogger(__name__)

CALIBRATION_FRAMES = 100
HELD_OUT_START = 200
IOU_MATCH = 0.5
AGREEMENT_FUNCTIONS = ("detection_agreement", "agreement", "f1_agreement", "compare_models")


def int8_path(model_path: Path) -> Path:
    return model_path.with_name(f"{model_path.stem}-int8.onnx")


def ensure_int8(model_path: Path, calib: Path, frames: int) -> Path:
    path = int8_path(model_path)
    if path.exists():
        return path
    from app.models.quantize import quantize_model

    logger.info("bench: quantizing %s on %d frames of %s", model_path.name, frames, calib.name)
    return Path(quantize_model(model_path, calib, path, frames=frames))


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` ``(n, 4)`` with every box of ``b`` ``(m, 4)``, xyxy."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def matches(reference: Detections, candidate: Detections, iou: float = IOU_MATCH) -> int:
    """Greedy one-to-one matching, best candidate score first: same class and IoU >= ``iou``."""
    overlaps = iou_matrix(candidate.xyxy, reference.xyxy)
    taken = np.zeros(len(reference), bool)
    found = 0
    for i in np.argsort(-candidate.scores, kind="stable"):
        ok = (overlaps[i] >= iou) & (reference.class_ids == candidate.class_ids[i]) & ~taken
        if ok.any():
            taken[int(np.argmax(np.where(ok, overlaps[i], -1)))] = True
            found += 1
    return found


def f1_score(reference: list[Detections], candidate: list[Detections]) -> dict[str, float]:
    matched = sum(matches(r, c) for r, c in zip(reference, candidate, strict=True))
    ref_total, cand_total = sum(len(r) for r in reference), sum(len(c) for c in candidate)
    precision = matched / cand_total if cand_total else 1.0
    recall = matched / ref_total if ref_total else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"f1": round(f1, 4), "precision": round(precision, 4), "recall": round(recall, 4),
            "reference_detections": ref_total, "int8_detections": cand_total}


def detections_of(engine: Any, frames: list[np.ndarray], boxes: list, spec: Any, model_cfg: Any) -> list[Detections]:
    out: list[Detections] = []
    step = max(1, min(8, max(engine.batch_sizes)))
    for start in range(0, len(frames), step):
        outputs = [np.array(o) for o in engine.submit(frames[start:start + step]).wait()]
        out.extend(decode_batch(outputs, spec, boxes[start:start + step], conf_threshold=model_cfg.conf_threshold,
                                iou_threshold=model_cfg.iou_threshold, class_ids_keep=None,
                                max_detections=model_cfg.max_detections))
    return out


def held_out_frames(clip: Path, spec: Any, count: int) -> tuple[list[np.ndarray], list]:
    """Every 4th frame after :data:`HELD_OUT_START` (the calibration took the first frames)."""
    frames, boxes = load_frames(str(clip), HELD_OUT_START + 4 * count, spec)
    if len(frames) <= HELD_OUT_START:
        return frames[-count:], boxes[-count:]
    return frames[HELD_OUT_START::4][:count], boxes[HELD_OUT_START::4][:count]


def agreement(ctx: Any, fp32_spec: Any, int8_spec: Any, int8_model: Path, clip: Path, count: int,
              calibration_frames: int) -> dict[str, Any]:
    """F1 of INT8 against fp32 on held-out frames: the quantizer's own function when it has one, else ours."""
    from app.engines import create_engine
    from app.models import quantize

    for name in AGREEMENT_FUNCTIONS:
        fn = getattr(quantize, name, None)
        if not callable(fn):
            continue
        try:
            value = fn(ctx.model_path, int8_model, clip, frames=count, calibration_frames=calibration_frames)
        except TypeError:
            value = fn(ctx.model_path, int8_model, clip)
        if isinstance(value, dict) and "f1" in value:
            return {**value, "method": f"{fn.__module__}.{name}"}
        if isinstance(value, int | float):
            return {"f1": float(value), "method": f"{fn.__module__}.{name}"}
    frames, boxes = held_out_frames(clip, fp32_spec, count)
    engines = [create_engine(fp32_spec, ctx.config.engine), create_engine(int8_spec, ctx.config.engine)]
    try:
        reference, candidate = (detections_of(e, frames, boxes, fp32_spec, ctx.config.model) for e in engines)
    finally:
        for engine in engines:
            engine.close()
    return {**f1_score(reference, candidate), "frames": len(frames),
            "method": f"bench: greedy match, same class, IoU >= {IOU_MATCH}, frames {HELD_OUT_START}+ every 4th"}


def run_int8(ctx: Any, results: dict[str, Any]) -> dict[str, Any]:
    from app.config import parse_config
    from app.engines import create_engine
    from app.pipeline import load_spec

    plan = ctx.plan
    clip = ctx.clips[plan.clips[0]]
    calib_frames = 20 if plan.quick else CALIBRATION_FRAMES
    model = ensure_int8(ctx.model_path, clip, calib_frames)
    tree = ctx.config.model_dump(mode="json", exclude_unset=True)
    tree["model"] = {**tree.get("model", {}), "path": str(model), "name": None}
    spec = load_spec(parse_config(tree, env={}), plan.models_dir, None)
    frames, _ = load_frames(str(clip), plan.frames_in_memory, spec)
    engines = {"fp32": create_engine(ctx.spec, ctx.config.engine), "int8": create_engine(spec, ctx.config.engine)}
    rounds: dict[str, list[dict[str, Any]]] = {"fp32": [], "int8": []}
    try:
        sizes = {name: prepare(engine, frames, [1, 2, 4, 8]) for name, engine in engines.items()}
        for _ in range(plan.repeats):  # fp32 and int8 back to back in every round: the speedup is paired
            for name, engine in engines.items():
                wait_for_quiet(plan.settle_s)
                rounds[name].append(measure_round(engine, frames, sizes[name], plan.model_seconds))
    finally:
        for engine in engines.values():
            engine.close()
    model_only = summarize(rounds["int8"], engines["int8"].backend, len(frames), plan.model_seconds)
    fp32_same_rounds = summarize(rounds["fp32"], engines["fp32"].backend, len(frames), plan.model_seconds)
    best_int8, best_fp32 = model_only["best_batch"], fp32_same_rounds["best_batch"]
    paired = [i["fps"][best_int8] / f["fps"][best_fp32] for i, f in zip(rounds["int8"], rounds["fp32"], strict=True)]
    out: dict[str, Any] = {"model": str(model), "clip": clip_tools.clip_label(plan.clips[0]),
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
    out.update(agreement(ctx, ctx.spec, spec, model, clip, 12 if plan.quick else 60, calib_frames))
    return out
