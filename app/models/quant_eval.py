"""Measure INT8 against fp32 on this CPU: model-only fps at batch 1 and 4, and detection agreement.

    python -m app.models.quant_eval --clip vtest.avi --variants qdq,qoperator --json out/quant.json

Each variant quantizes the model with its :class:`QuantOptions` (calibrated on
evenly spaced frames of the clip), then fp32 and INT8 sessions take turns
(``--repeats`` rounds of ``--seconds`` each per batch size) so that a
neighbour's load hits both alike; fps is frames per median batch latency,
median over rounds. F1 is measured on frames halfway between the calibration
frames (see :mod:`app.models.agreement`). This is a measuring tool for
docs/models.md, not part of the pipeline.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.models.agreement import detect, f1_agreement, held_out_indices, load_inputs
from app.models.calibration import video_frame_count
from app.models.quantize import QuantOptions, quantize_model
from app.models.spec import load_model_spec

logger = logging.getLogger(__name__)

QDQ_CLEANUP = {"session.enable_quant_qdq_cleanup": "1"}


@dataclass(frozen=True)
class Variant:
    """One way to quantize, plus session config entries the INT8 session runs with."""

    options: QuantOptions
    session_config: dict[str, str] = field(default_factory=dict)


VARIANTS: dict[str, Variant] = {
    "qdq": Variant(QuantOptions()),
    "qdq-cleanup": Variant(QuantOptions(), QDQ_CLEANUP),
    "qdq-s8": Variant(QuantOptions(activation_type="int8")),
    "qdq-s8-symmetric": Variant(QuantOptions(activation_type="int8", activation_symmetric=True)),
    "qdq-entropy": Variant(QuantOptions(method="entropy")),
    "qdq-percentile": Variant(QuantOptions(method="percentile")),
    "qdq-reduce-range": Variant(QuantOptions(reduce_range=True)),
    "qdq-per-tensor": Variant(QuantOptions(per_channel=False)),
    "qdq-output-convs-fp32": Variant(QuantOptions(exclude_output_convs=True)),
    "qdq-no-preprocess": Variant(QuantOptions(preprocess=False)),
    "qoperator": Variant(QuantOptions(quant_format="qoperator")),
}


def _session(model: Path, threads: int, config: dict[str, str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _round_fps(runner: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> float:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while (time.perf_counter() < deadline or len(latencies) < 3) and len(latencies) < 1000:
        start = time.perf_counter()
        runner.run(None, feed)
        latencies.append(time.perf_counter() - start)
    return len(next(iter(feed.values()))) / statistics.median(latencies)


def interleaved_fps(models: dict[str, tuple[Path, dict[str, str]]], frames: list[np.ndarray], batches: list[int],
                    seconds: float, repeats: int, threads: int) -> dict[str, dict[int, float]]:
    """Median fps per model and batch size, the models taking turns round by round."""
    spec = load_model_spec(next(iter(models.values()))[0])
    runners = {name: _session(path, threads, config) for name, (path, config) in models.items()}
    rounds: dict[tuple[str, int], list[float]] = {}
    for batch in batches:
        feed = {spec.input_name: np.stack([frames[i % len(frames)] for i in range(batch)])}
        for runner in runners.values():  # warm-up: first runs allocate and pick kernels
            for _ in range(2):
                runner.run(None, feed)
        for _ in range(repeats):
            for name, runner in runners.items():
                rounds.setdefault((name, batch), []).append(_round_fps(runner, feed, seconds))
    return {name: {b: round(statistics.median(rounds[(name, b)]), 2) for b in batches} for name in runners}


def evaluate(model: Path, clip: Path, variants: list[str], calib_frames: int, held_out: int, seconds: float,
             repeats: int, threads: int, out_dir: Path) -> dict[str, Any]:
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
                              seconds, repeats, threads)
        entry = {"options": asdict(variant.options), "session_config": variant.session_config,
                 "quantize_s": round(quantize_s, 1), "agreement": agreement.as_dict(), "fps": fps,
                 "speedup": {b: round(fps["int8"][b] / fps["fp32"][b], 2) for b in (1, 4)}}
        report["variants"][name] = entry
        print(f"{name:24s} F1 {agreement.f1:.3f} (P {agreement.precision:.3f} R {agreement.recall:.3f}, "
              f"{agreement.reference_detections} ref)  fps b1 {fps['fp32'][1]:.1f} -> {fps['int8'][1]:.1f} "
              f"({entry['speedup'][1]:.2f}x)  b4 {fps['fp32'][4]:.1f} -> {fps['int8'][4]:.1f} "
              f"({entry['speedup'][4]:.2f}x)  quantize {quantize_s:.0f} s", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.models.quant_eval", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--clip", default="vtest.avi", help="vtest.avi, bikes.mp4 (fetched) or a video path")
    parser.add_argument("--variants", default="qdq", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--calib-frames", type=int, default=100)
    parser.add_argument("--held-out", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
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
        report = evaluate(args.model, clip, names, args.calib_frames, args.held_out, args.seconds, args.repeats,
                          args.threads, out_dir)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
