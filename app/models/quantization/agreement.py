"""How far an INT8 model's detections agree with its fp32 original, on frames calibration never saw.

Agreement, not accuracy: without labels the fp32 model is the reference, and
the question is whether quantization changed what the pipeline would publish.
Frames go through the pipeline's own letterbox (rectangular for a model with
a dynamic input, as the pipeline feeds it) and decode
(:func:`app.postprocess.yolo.decode_batch`); a candidate detection matches a
reference one of the same class with IoU >= 0.5, greedily by score, and
F1 = 2PR / (P + R).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.config import ModelConfig
from app.models.quantization.calibration import InputFit, decode_frames, evenly_spaced, video_frame_count
from app.models.spec import load_model_spec
from app.postprocess.yolo import decode_batch
from app.preprocess import letterbox_into
from app.types import FLOAT_CHW, Detections, FrameFormat, Letterbox, ModelSpec

PUBLISHED = ModelConfig()
"""The pipeline's default model settings: the detections compared are those it would publish."""
CONF_THRESHOLD = PUBLISHED.conf_threshold
NMS_IOU = PUBLISHED.iou_threshold


@dataclass(frozen=True, slots=True)
class Agreement:
    """Detection agreement of a candidate model with a reference one over ``frames`` frames.

    ``matched`` candidate detections found a reference one; precision, recall and F1 follow from the counts
    (rounded to 4 places; 1.0 where there is nothing to miss).
    """

    matched: int
    reference_detections: int
    candidate_detections: int
    frames: int

    @property
    def precision(self) -> float:
        return round(_share(self.matched, self.candidate_detections), 4)

    @property
    def recall(self) -> float:
        return round(_share(self.matched, self.reference_detections), 4)

    @property
    def f1(self) -> float:
        precision = _share(self.matched, self.candidate_detections)
        recall = _share(self.matched, self.reference_detections)
        return round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0

    def as_dict(self) -> dict[str, Any]:
        """F1, precision, recall and the detection and frame counts, as the reports print them."""
        return {"f1": self.f1, "precision": self.precision, "recall": self.recall,
                "reference_detections": self.reference_detections,
                "candidate_detections": self.candidate_detections, "frames": self.frames}


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 1.0


def held_out_indices(total: int, calibration_frames: int, count: int) -> list[int]:
    """``count`` frame indices halfway between the calibration frames of :func:`evenly_spaced`, never one of them."""
    calibration = evenly_spaced(total, calibration_frames)
    taken = set(calibration)
    between = [(a + b) // 2 for a, b in pairwise(calibration)]
    candidates = [i for i in between if i not in taken] or [i for i in range(total) if i not in taken]
    return [candidates[i] for i in evenly_spaced(len(candidates), count)]


def load_inputs(clip: Path, indices: list[int], spec: ModelSpec,
                frame_format: FrameFormat = FLOAT_CHW) -> tuple[list[np.ndarray], list[Letterbox]]:
    """Letterboxed inputs (at the size the pipeline feeds ``spec``, in ``frame_format``: an engine's
    :attr:`~app.engines.base.Engine.frame_format`) and their letterboxes."""
    fit = InputFit.of(spec)
    inputs, boxes = [], []
    for _, rgb in decode_frames(clip, sorted(indices)):
        tensor = fit.blank(rgb.shape[1], rgb.shape[0], frame_format)
        boxes.append(letterbox_into(rgb, tensor, spec.scale))
        inputs.append(tensor)
    return inputs, boxes


def session(model: Path, threads: int = 2, config: dict[str, str] | None = None) -> ort.InferenceSession:
    """A CPU session as the benchmarks use it: all graph optimisations, ``threads`` intra-op threads.

    ``config`` holds extra session config entries (``session.enable_quant_qdq_cleanup`` ...).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"],
                                **load_model_spec(model).ort_session_kwargs())  # as the engine runs it


def published(outputs: list[np.ndarray], spec: ModelSpec, box: Letterbox) -> Detections:
    """One frame's detections from the model's raw outputs, decoded as the pipeline publishes them."""
    return decode_batch(outputs, spec, [box], conf_threshold=PUBLISHED.conf_threshold,
                        iou_threshold=PUBLISHED.iou_threshold, class_ids_keep=None,
                        max_detections=PUBLISHED.max_detections)[0]


def detect(model: Path, inputs: list[np.ndarray], boxes: list[Letterbox], threads: int = 2) -> list[Detections]:
    """The pipeline's detections (:func:`published`) for each input, one frame at a time."""
    spec = load_model_spec(model)
    runner = session(model, threads)
    return [published(runner.run(None, {spec.input_name: tensor[None]}), spec, box)
            for tensor, box in zip(inputs, boxes, strict=True)]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def _matches(reference: Detections, candidate: Detections, match_iou: float) -> int:
    overlaps = _iou(candidate.xyxy, reference.xyxy)
    taken = np.zeros(len(reference), bool)
    found = 0
    for i in np.argsort(-candidate.scores, kind="stable"):
        ok = (overlaps[i] >= match_iou) & (reference.class_ids == candidate.class_ids[i]) & ~taken
        if ok.any():
            taken[int(np.argmax(np.where(ok, overlaps[i], -1.0)))] = True
            found += 1
    return found


def f1_agreement(reference: list[Detections], candidate: list[Detections], match_iou: float = 0.5) -> Agreement:
    """Greedy one-to-one matching per frame (same class, IoU >= ``match_iou``, highest score first)."""
    matched = sum(_matches(r, c, match_iou) for r, c in zip(reference, candidate, strict=True))
    return Agreement(matched, sum(len(r) for r in reference), sum(len(c) for c in candidate), len(reference))


def detection_agreement(fp32_model: Path | str, int8_model: Path | str, clip: Path | str, frames: int = 40,
                        calibration_frames: int = 100) -> dict[str, Any]:
    """F1 of ``int8_model`` against ``fp32_model`` on ``frames`` frames of ``clip`` that calibration skipped.

    Held-out frames lie halfway between the frames :func:`app.models.quantization.quantize.quantize_model`
    calibrates on when given ``calibration_frames`` of the same clip.
    """
    fp32_model, int8_model, clip = Path(fp32_model), Path(int8_model), Path(clip)
    spec = load_model_spec(fp32_model)
    indices = held_out_indices(video_frame_count(clip), calibration_frames, frames)
    inputs, boxes = load_inputs(clip, indices, spec)
    result = f1_agreement(detect(fp32_model, inputs, boxes), detect(int8_model, inputs, boxes))
    return {**result.as_dict(), "clip": clip.name, "held_out_frames": indices}
