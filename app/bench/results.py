"""The typed result of ``detstream bench``, written as JSON with :meth:`BenchResult.model_dump_json`.

Read one back with ``BenchResult.model_validate_json(path.read_text())``. Every
repeated figure is a :class:`Spread` (median, min, max and the runs); each
section is a list with one entry per clip and precision (``fp32``, and
``int8`` with ``--int8``), so that runs of one machine compare directly.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict

SCHEMA = "detstream.bench/2"

Precision = str
"""The variant an entry measured: ``fp32`` / ``int8`` (the model file, on ``--engine``), or with ``--engines``
``BACKEND:PRECISION`` as asked (``openvino:int8``, ``auto``); the entry's ``engine`` says what really ran."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Spread(_Model):
    """Median and range of one figure over repeated runs (``None`` when no run gave a value)."""

    median: float | None
    min: float | None
    max: float | None
    runs: list[float]

    @classmethod
    def of(cls, values: list[float | None], digits: int = 2) -> Spread:
        runs = [round(float(v), digits) for v in values if v is not None and math.isfinite(float(v))]
        if not runs:
            return cls(median=None, min=None, max=None, runs=[])
        return cls(median=round(statistics.median(runs), digits), min=min(runs), max=max(runs), runs=runs)


class Machine(_Model):
    cpu: str
    cpu_flags: list[str]
    logical_cpus: int
    memory_gb: float
    os: str
    python: str
    onnxruntime: str
    providers: list[str]
    commit: str
    openvino: str | None = None
    """The OpenVINO version, None when it is not installed."""


class ModelInfo(_Model):
    name: str
    path: str
    precision: Precision
    input_hw: tuple[int, int]
    layout: str


class BatchRate(_Model):
    fps: Spread
    ms_per_batch: Spread


class ModelOnly(_Model):
    """The engine alone on frames already letterboxed in memory: the most the pipeline could reach."""

    precision: Precision
    clip: str
    engine: str
    input_hw: tuple[int, int]
    batches: dict[int, BatchRate]
    best_batch: int
    best_fps: Spread


class Naive(_Model):
    """The tutorial loop (``cv2.VideoCapture`` → ``session.run`` → NMS, one frame at a time)."""

    clip: str
    providers: list[str]
    frames: int
    fps: Spread


class FileMode(_Model):
    """``detstream run --source CLIP`` end to end, counted at a subscriber."""

    precision: Precision
    clip: str
    command: str
    engine: str
    frames: int
    lossless: bool
    fps: Spread
    wall_s: Spread
    p50_ms: Spread
    p99_ms: Spread
    peak_rss_mb: Spread
    of_model_only: float | None
    """File-mode fps over model-only fps at the best batch size (medians)."""
    of_naive: float | None
    """File-mode fps over the naive loop's fps (medians; fp32 only)."""


class LiveStep(_Model):
    """K simulated cameras on one worker, repeated; latency is ``published_at − captured_at``."""

    k: int
    demand_fps: float
    published_fps: Spread
    p50_ms: Spread
    p99_ms: Spread
    drops: Spread
    peak_rss_mb: Spread
    running_rss_mb: Spread
    passed: bool
    """No frame dropped in any repeat, and the median p99 within the bound."""


class Live(_Model):
    """The capacity search: K upward until a K fails; ``max_cameras`` is the largest K that passed below it."""

    precision: Precision
    clip: str
    engine: str
    fps_per_camera: float
    duration_s: float
    p99_bound_ms: float
    steps: list[LiveStep]
    max_cameras: int


class Memory(_Model):
    """Resident memory of the worker with few and with many cameras, and the cost of one more camera."""

    precision: Precision
    low_k: int
    high_k: int
    peak_rss_mb_low: Spread
    peak_rss_mb_high: Spread
    running_rss_mb_low: Spread
    running_rss_mb_high: Spread
    rss_per_camera_mb: float | None
    """From the running figures, which leave out the start-up transient (model load)."""


class BenchResult(_Model):
    format: Literal["detstream.bench/2"] = SCHEMA
    started_at: float
    elapsed_s: float = 0.0
    quick: bool
    machine: Machine
    models: list[ModelInfo] = []
    model_only: list[ModelOnly] = []
    naive: list[Naive] = []
    file: list[FileMode] = []
    live: list[Live] = []
    memory: list[Memory] = []
    errors: dict[str, str] = {}
    interrupted: str | None = None
