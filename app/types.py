"""Data that flows through the pipeline, one way: decoder → ring → engine → postprocess → publish.

Coordinate frames are named: ``input`` pixels are the model's letterboxed
input (e.g. 416×416); ``frame`` pixels are the original decoded frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from app.analytics.engine import FrameAnalytics

OutputLayout = str
"""A name registered in :data:`app.postprocess.layouts.LAYOUTS` (``yolov5``, ``yolov8``, ``nms``, ...)."""

LATENCY_STAGES = ("decode", "queue", "infer", "post", "total")
"""Per-frame latency stages, in pipeline order: a message's ``latency_ms`` keys and the metrics' ``stage`` labels."""


@dataclass(frozen=True, slots=True)
class FrameFormat:
    """How a letterboxed frame is laid out in its ring slot: what an engine reads.

    :data:`FLOAT_CHW` is the model's own input, ``(3, H, W)`` float32 already scaled by ``ModelSpec.scale``:
    what ONNX Runtime and TensorRT read. :data:`UINT8_HWC` is the decoded pixels themselves, ``(H, W, 3)``
    uint8, for an engine that converts, scales and transposes inside its own graph (OpenVINO): a quarter
    of the bytes, and no float work on the decoder threads.
    """

    dtype: str
    channels_last: bool

    def shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The ``(3, H, W)`` or ``(H, W, 3)`` shape of one frame."""
        return (height, width, 3) if self.channels_last else (3, height, width)

    def hw(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(height, width)`` of a frame of this format's ``shape``."""
        return (shape[0], shape[1]) if self.channels_last else (shape[1], shape[2])

    @staticmethod
    def of(frame: np.ndarray) -> FrameFormat:
        """The format ``frame`` is in (by its dtype: the two formats differ in both)."""
        return UINT8_HWC if frame.dtype == np.uint8 else FLOAT_CHW


FLOAT_CHW = FrameFormat("float32", channels_last=False)
UINT8_HWC = FrameFormat("uint8", channels_last=True)


@dataclass(frozen=True, slots=True)
class Letterbox:
    """How a frame was fitted into the model input: ``x_input = x_frame * scale + pad_x``.

    ``src_width``/``src_height`` are the frame's own size, which may change
    mid-stream (a camera switching resolution); each frame carries its own.
    """

    scale: float
    pad_x: float
    pad_y: float
    src_width: int
    src_height: int

    def to_frame(self, xyxy_input: np.ndarray) -> np.ndarray:
        """Map ``(n, 4)`` input-pixel boxes to frame pixels, clipped to the frame (float32)."""
        out = np.empty_like(xyxy_input, dtype=np.float32)
        out[:, 0::2] = (xyxy_input[:, 0::2] - self.pad_x) / self.scale
        out[:, 1::2] = (xyxy_input[:, 1::2] - self.pad_y) / self.scale
        np.clip(out[:, 0::2], 0, self.src_width, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, self.src_height, out=out[:, 1::2])
        return out


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the pipeline needs to know about a model, read from the ONNX file (and config overrides).

    ``input_height``/``input_width`` are the network input in pixels; input is
    RGB float32 NCHW, ``pixel * scale`` (1/255 for YOLO); an engine may read
    :data:`UINT8_HWC` frames and do that conversion in its graph. ``static_batch`` is
    the fixed batch dimension of the model, or None when it is dynamic.
    ``dynamic_hw`` is true when the input's height and width are symbolic in
    the ONNX file, so the model runs at any multiple of ``stride`` up to
    ``input_height`` × ``input_width`` (rectangular letterbox); the input size
    is then the nominal (largest) one. ``ort_disabled_optimizers``: ONNX
    Runtime graph optimizers the file asks sessions to skip (metadata
    ``detstream.ort_disabled_optimizers``; see :mod:`app.models.quantization.quantize`).
    """

    name: str
    path: str
    input_name: str
    input_height: int
    input_width: int
    layout: OutputLayout
    class_names: tuple[str, ...]
    static_batch: int | None = None
    scale: float = 1.0 / 255.0
    sha256: str = ""
    dynamic_hw: bool = False
    stride: int = 32
    ort_disabled_optimizers: tuple[str, ...] = ()

    def ort_session_kwargs(self) -> dict[str, list[str]]:
        """Extra ``onnxruntime.InferenceSession`` arguments the model file asks for (its disabled optimizers)."""
        return {"disabled_optimizers": list(self.ort_disabled_optimizers)} if self.ort_disabled_optimizers else {}


@dataclass(slots=True)
class FrameMeta:
    """Everything known about one decoded frame besides its pixels (which live in a ring slot).

    Times: ``captured_at`` is wall-clock epoch seconds (for subscribers);
    ``t_*`` are ``time.monotonic()`` seconds (for latencies).
    ``image`` is the original BGR frame ``(H, W, 3) uint8``, kept only when a
    sink (annotation) needs it, else None.
    """

    stream_id: str
    seq: int
    pts_s: float | None
    captured_at: float
    t_captured: float
    decode_ms: float
    letterbox: Letterbox
    dropped_before: int = 0
    t_ready: float = 0.0
    image: np.ndarray | None = None


@dataclass(slots=True)
class Detections:
    """Detections of one frame as parallel arrays, in frame pixels.

    ``xyxy``: ``(n, 4)`` float32, x1 < x2, y1 < y2, clipped to the frame.
    ``scores``: ``(n,)`` float32. ``class_ids``: ``(n,)`` int32.
    ``track_ids``: ``(n,)`` int64, -1 where untracked.
    """

    xyxy: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    track_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def __post_init__(self) -> None:
        n = len(self.scores)
        if self.xyxy.shape != (n, 4) or self.class_ids.shape != (n,):
            raise ValueError(f"Detections: xyxy {self.xyxy.shape}, class_ids {self.class_ids.shape} for {n} scores")
        if self.track_ids.shape != (n,):
            self.track_ids = np.full(n, -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.scores)

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))

    def select(self, mask: np.ndarray) -> Detections:
        """A new object holding the rows where ``mask`` is true."""
        return Detections(self.xyxy[mask], self.scores[mask], self.class_ids[mask], self.track_ids[mask])


@dataclass(slots=True)
class FrameResult:
    """One frame's outcome, ready to publish.

    Latencies in milliseconds: ``queue_ms`` from the frame's arrival in the
    batcher to its batch's submission, ``infer_ms`` from submission to
    result, ``post_ms`` its share of the batch's decode and NMS. ``cpu_ms``
    is its share of the batch's inference CPU time where the engine measures
    it (CPU workers), else None. ``analytics``: the frame's zone and line
    events and counts when its stream has any (:mod:`app.analytics`), else None.
    """

    meta: FrameMeta
    detections: Detections
    queue_ms: float
    infer_ms: float
    post_ms: float = 0.0
    cpu_ms: float | None = None
    analytics: FrameAnalytics | None = None

    def latencies_ms(self, total_ms: float) -> tuple[tuple[str, float], ...]:
        """``(stage, ms)`` for every :data:`LATENCY_STAGES` entry; ``total_ms`` is capture to publish."""
        return (("decode", self.meta.decode_ms), ("queue", self.queue_ms), ("infer", self.infer_ms),
                ("post", self.post_ms), ("total", total_ms))
