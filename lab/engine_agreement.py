"""Detection agreement between two engines on the same frames: F1 of a candidate engine against a reference
(default: OpenVINO at ``engine.precision: auto`` against ONNX Runtime fp32), IoU >= 0.5, same class.

Both engines are made by ``create_engine`` from the same model and config, so what is compared is what the pipeline
would publish; frames go through the pipeline's letterbox at the size it feeds the model (rectangular where the
engine accepts it) and through the same decode. Frames are spread evenly over each clip.

Run: ``python lab/engine_agreement.py [--clips vtest,bikes] [--frames 100] [--candidate openvino:auto]
[--reference onnxruntime:fp32] [--model models/yolov3-tiny.onnx]`` (about 20 s for 2 x 100 frames on 2 cores).

``--calibrate-per-clip N`` is for an INT8 candidate (``openvino:int8``, ``onnxruntime:int8``): for each clip the
model is quantized on N evenly spaced frames of that clip's own footage (``<model>-int8.onnx`` beside a link to
the model, in a temporary folder), and the frames compared are held out halfway between the calibration frames
(:func:`~app.models.quantization.agreement.held_out_indices`), as ``lab/quant_eval.py`` does for ONNX Runtime.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from app.assets import fetch_clip
from app.config import EngineConfig
from app.engines import create_engine
from app.models.quantization.agreement import f1_agreement, held_out_indices, load_inputs, published
from app.models.quantization.calibration import evenly_spaced, video_frame_count
from app.models.quantization.quantize import default_output, quantize_model
from app.models.spec import load_model_spec
from app.types import Detections


def detections(engine_name: str, model: Path, clip: Path, indices: list[int]) -> tuple[str, list[Detections]]:
    backend, _, precision = engine_name.partition(":")
    spec = load_model_spec(model)
    engine = create_engine(spec, EngineConfig(backend=backend, precision=precision or "auto", max_batch=1))
    try:
        inputs, boxes = load_inputs(clip, indices, spec, engine.frame_format)  # the pipeline's rectangle
        return engine.backend, [published(engine.submit([tensor]).wait(), spec, box)
                                for tensor, box in zip(inputs, boxes, strict=True)]
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", default="vtest,bikes")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--candidate", default="openvino:auto")
    parser.add_argument("--reference", default="onnxruntime:fp32")
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--calibrate-per-clip", type=int, metavar="N", help="INT8 candidate: quantize on N frames "
                        "of each clip, compare on frames held out between them")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in args.clips.split(","):
        clip = fetch_clip({"vtest": "vtest.avi", "bikes": "bikes.mp4"}.get(name, name))  # type: ignore[arg-type]
        total = video_frame_count(clip)
        with tempfile.TemporaryDirectory() as folder:
            model = args.model.resolve()
            if args.calibrate_per_clip:
                indices = held_out_indices(total, args.calibrate_per_clip, args.frames)
                model = Path(folder) / model.name
                model.symlink_to(args.model.resolve())
                quantize_model(model, clip, default_output(model), args.calibrate_per_clip)
            else:
                indices = evenly_spaced(total, args.frames)
            ref_engine, reference = detections(args.reference, model, clip, indices)
            cand_engine, candidate = detections(args.candidate, model, clip, indices)
        agreement = f1_agreement(reference, candidate)
        print(f"{name}: {cand_engine} vs {ref_engine} on {agreement.frames} frames: F1 {agreement.f1:.3f} "
              f"(P {agreement.precision:.3f}, R {agreement.recall:.3f}; {agreement.reference_detections} vs "
              f"{agreement.candidate_detections} detections)")


if __name__ == "__main__":
    main()
