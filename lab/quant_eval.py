"""Measure INT8 against fp32 on this CPU: model-only fps at batch 1 and 4, and detection agreement.

    python -m lab.quant_eval --clip vtest.avi --variants default,qoperator --json out/quant.json

Each variant quantizes the model with its :class:`QuantOptions` (calibrated on
evenly spaced frames of the clip), then fp32 and INT8 sessions take turns
run by run for ``--seconds`` per batch size, so that a neighbour's load hits
both alike; fps is frames per median (and per 10th-percentile) batch latency.
F1 is measured on frames halfway between the calibration frames (see
:mod:`app.models.quantization.agreement`). Frames are letterboxed as the pipeline feeds
the model: for a dynamic-input model (converter v2) at the clip's rectangle,
416x320 for vtest and 416x192 for bikes. This is a measuring tool for
docs/models.md, not part of the product (``lab/`` imports ``app``, never the reverse).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.models.quantization.agreement import detect, f1_agreement, held_out_indices, load_inputs, session
from app.models.quantization.calibration import video_frame_count
from app.models.quantization.quantize import QuantOptions, quantize_model
from app.models.spec import load_model_spec

logger = logging.getLogger(__name__)

QDQ_CLEANUP = {"session.enable_quant_qdq_cleanup": "1"}


@dataclass(frozen=True)
class Variant:
    """One way to quantize, plus session config entries the INT8 session runs with."""

    options: QuantOptions
    session_config: dict[str, str] = field(default_factory=dict)


_MINMAX = QuantOptions(moving_average=False)  # the plain baseline every alternative below changes one thing of

VARIANTS: dict[str, Variant] = {
    "default": Variant(QuantOptions()),
    "int8-stem": Variant(QuantOptions(fp32_stem=False)),  # quantizer v1: the first conv block in INT8 too
    "qdq-minmax": Variant(_MINMAX),
    "qdq-minmax-cleanup": Variant(_MINMAX, QDQ_CLEANUP),
    "qdq-s8": Variant(replace(_MINMAX, activation_type="int8")),
    "qdq-s8-symmetric": Variant(replace(_MINMAX, activation_type="int8", activation_symmetric=True)),
    "qdq-entropy": Variant(replace(_MINMAX, method="entropy")),
    "qdq-percentile": Variant(replace(_MINMAX, method="percentile")),
    "qdq-moving-average": Variant(replace(_MINMAX, moving_average=True)),
    "qdq-reduce-range": Variant(replace(_MINMAX, reduce_range=True)),
    "qdq-per-tensor": Variant(replace(_MINMAX, per_channel=False)),
    "qdq-output-convs-fp32": Variant(replace(_MINMAX, exclude_output_convs=True)),
    "qdq-no-preprocess": Variant(replace(_MINMAX, preprocess=False)),
    "qoperator": Variant(replace(_MINMAX, quant_format="qoperator")),
}


def interleaved_fps(models: dict[str, tuple[Path, dict[str, str]]], frames: list[np.ndarray], batches: list[int],
                    seconds: float, threads: int) -> dict[str, dict[str, dict[int, float]]]:
    """fps per model and batch size: ``median`` and ``p10`` (from the 10th-percentile latency).

    The models alternate run by run for ``seconds`` per batch size, so a
    neighbour's load hits every model alike; on a shared machine ``p10`` is
    the closer estimate of the unloaded speed and the ratios of both agree.
    """
    spec = load_model_spec(next(iter(models.values()))[0])
    runners = {name: session(path, threads, config) for name, (path, config) in models.items()}
    result: dict[str, dict[str, dict[int, float]]] = {name: {"median": {}, "p10": {}} for name in runners}
    for batch in batches:
        feed = {spec.input_name: np.stack([frames[i % len(frames)] for i in range(batch)])}
        for runner in runners.values():  # warm-up: first runs allocate and pick kernels
            for _ in range(2):
                runner.run(None, feed)
        latencies: dict[str, list[float]] = {name: [] for name in runners}
        deadline = time.perf_counter() + seconds
        for _ in range(2000):
            if time.perf_counter() > deadline and len(latencies[next(iter(runners))]) >= 5:
                break
            for name, runner in runners.items():
                started = time.perf_counter()
                runner.run(None, feed)
                latencies[name].append(time.perf_counter() - started)
        for name, values in latencies.items():
            result[name]["median"][batch] = round(batch / statistics.median(values), 2)
            result[name]["p10"][batch] = round(batch / float(np.percentile(values, 10)), 2)
    return result


def evaluate(model: Path, clip: Path, variants: list[str], calib_frames: int, held_out: int, seconds: float,
             threads: int, out_dir: Path) -> dict[str, Any]:
    """Quantize once per variant, then measure speed and agreement; a JSON-ready report."""
    spec = load_model_spec(model)
    indices = held_out_indices(video_frame_count(clip), calib_frames, held_out)
    inputs, boxes = load_inputs(clip, indices, spec)
    reference = detect(model, inputs, boxes, threads)
    report: dict[str, Any] = {"model": str(model), "clip": clip.name, "calibration_frames": calib_frames,
                              "held_out_frames": len(indices), "threads": threads, "onnxruntime": ort.__version__,
                              "variants": {}}
    for name in variants:
        variant = VARIANTS[name]
        started = time.perf_counter()
        int8 = quantize_model(model, clip, out_dir / f"{model.stem}-{name}.onnx", calib_frames, options=variant.options)
        quantize_s = time.perf_counter() - started
        agreement = f1_agreement(reference, detect(int8, inputs, boxes, threads))
        fps = interleaved_fps({"fp32": (model, {}), "int8": (int8, variant.session_config)}, inputs, [1, 4],
                              seconds, threads)
        speedup = {kind: {b: round(fps["int8"][kind][b] / fps["fp32"][kind][b], 2) for b in (1, 4)}
                   for kind in ("median", "p10")}
        report["variants"][name] = {"options": asdict(variant.options), "session_config": variant.session_config,
                                    "quantize_s": round(quantize_s, 1), "agreement": agreement.as_dict(),
                                    "fps": fps, "speedup": speedup}
        fp, q = fps["fp32"]["median"], fps["int8"]["median"]
        print(f"{name:22s} F1 {agreement.f1:.3f} (P {agreement.precision:.3f} R {agreement.recall:.3f}, "
              f"{agreement.reference_detections} ref)  median fps b1 {fp[1]:.1f} -> {q[1]:.1f} "
              f"({speedup['median'][1]:.2f}x) b4 {fp[4]:.1f} -> {q[4]:.1f} ({speedup['median'][4]:.2f}x)  "
              f"p10 speedup b1 {speedup['p10'][1]:.2f}x b4 {speedup['p10'][4]:.2f}x  quantize {quantize_s:.0f} s",
              flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.quant_eval", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--clip", default="vtest.avi", help="vtest.avi, bikes.mp4 (fetched) or a video path")
    parser.add_argument("--variants", default="default", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--calib-frames", type=int, default=100)
    parser.add_argument("--held-out", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=20.0, help="timing per batch size and variant")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, help="keep the INT8 models here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    clip = Path(args.clip)
    if args.clip in ("vtest.avi", "bikes.mp4"):
        from app.assets import fetch_clip

        clip = fetch_clip(args.clip)
    with tempfile.TemporaryDirectory(prefix="quant-eval-") as tmp:
        out_dir = args.out_dir or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        report = evaluate(args.model, clip, names, args.calib_frames, args.held_out, args.seconds, args.threads,
                          out_dir)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
