"""Benchmark 1, the model-only ceiling: the engine alone on frames already letterboxed in memory.

The engine is the one the pipeline builds (:func:`app.engines.create_engine`
with the pipeline's :class:`EngineConfig`; on a machine without a GPU that is
:class:`app.engines.onnxruntime.OrtEngine` on the CPU provider), fed the same
arrays the ring slots hold: letterboxed exactly as the decoder threads do it,
at the same input size (rectangular when the pipeline uses rectangular
inputs, so each clip has its own ceiling), and with as many batches in flight
as the pipeline keeps (:func:`app.pipeline.in_flight_batches` plus the one the
postprocess thread is reading), so the engine's contexts overlap as they do in
a run. No decoding, no queues, no postprocess: what is left is the most frames
per second the pipeline could ever reach.

Repeats are interleaved (every batch size once, then again), so that a noisy
minute on a shared machine does not land on one batch size only.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

import av
import numpy as np

from app.bench.common import Background, stat
from app.engines.base import Engine
from app.postprocess.yolo import decode_batch
from app.preprocess import fit_input_size, letterbox_into
from app.ring import aligned_empty
from app.sources.rgb import RgbConverter
from app.types import Letterbox, ModelSpec


def load_frames(clip: str, count: int, spec: ModelSpec, rect: bool = False) -> tuple[list[np.ndarray], list[Letterbox]]:
    """The first ``count`` frames of ``clip``, letterboxed exactly as the decoder threads do it.

    ``rect``: to the smallest multiple of the model's stride that holds the frame, as the pipeline does
    when :func:`app.pipeline.use_rect` says so; else to the full input size.
    """
    frames, boxes = [], []
    rgb = RgbConverter()  # the decoder threads' own conversion, so the pixels are the pipeline's
    with av.open(clip) as container:
        for frame in container.decode(video=0):
            height, width = fit_input_size(frame.width, frame.height, spec.input_width, spec.input_height,
                                           spec.stride, rect)
            slot = aligned_empty((3, height, width))
            boxes.append(letterbox_into(rgb.convert(frame), slot, spec.scale))
            frames.append(slot)
            if len(frames) >= count:
                break
    if not frames:
        raise RuntimeError(f"{clip}: no frames decoded")
    return frames, boxes


def prepare(engine: Engine, frames: list[np.ndarray], batch_sizes: list[int]) -> list[int]:
    """The batch sizes ``submit`` accepts, each called once (the first call of a size binds its buffers).

    The engine may accept larger batches than the pipeline builds (``engine.batch_sizes``): model-only
    measures every size it accepts, and the table says which ones the pipeline builds.
    """
    sizes = []
    for b in batch_sizes:
        try:
            engine.submit(_batch(frames, 0, b)).wait()
        except ValueError:  # more frames than this engine takes in one call
            continue
        sizes.append(b)
    return sizes


def measure_round(engine: Engine, frames: list[np.ndarray], sizes: list[int], seconds: float,
                  min_batches: int = 3, in_flight: int = 1) -> dict[str, Any]:
    """One timed run per batch size: ``{"fps": {b: ...}, "ms": {b: ...}, "background_cores": ...}``.

    ``in_flight``: batches submitted and not yet waited for, as the pipeline keeps them (1 = one at a time).
    """
    background = Background()
    fps, ms, cpu = {}, {}, {}
    for b in sizes:
        fps[b], ms[b], cpu[b] = _timed_run(engine, frames, b, seconds, min_batches, in_flight)
    return {"fps": fps, "ms": ms, "cpu_ms_per_frame": cpu, "background_cores": background.cores()}


def summarize(rounds: list[dict[str, Any]], engine_name: str, frames_in_memory: int,
              seconds: float, pipeline_batch_sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Median and spread per batch size over the rounds; ``best_fps`` is the best batch size's."""
    sizes = list(rounds[0]["fps"])
    batches = {}
    for b in sizes:
        ms = [r["ms"][b] for r in rounds]
        batches[str(b)] = {"fps": stat([r["fps"][b] for r in rounds]), "ms_per_batch": stat(ms),
                           "ms_per_frame": round(float(np.median(ms)) / b, 2),
                           "cpu_ms_per_frame": stat([r["cpu_ms_per_frame"][b] for r in rounds], 1)}
    best = max(sizes, key=lambda b: batches[str(b)]["fps"]["median"])
    return {"engine": engine_name, "frames_in_memory": frames_in_memory, "seconds_per_run": seconds,
            "pipeline_batch_sizes": list(pipeline_batch_sizes or []),
            "batches": batches, "best_batch": best, "best_fps": batches[str(best)]["fps"],
            "best_fps_per_round": [round(max(r["fps"].values()), 2) for r in rounds],
            "background_cores": stat([r["background_cores"] for r in rounds])}


def run_model_only(engine: Engine, frames: list[np.ndarray], batch_sizes: list[int], repeats: int,
                   seconds: float, in_flight: int = 1) -> dict[str, Any]:
    """fps and ms per batch for each batch size, median of ``repeats`` interleaved rounds."""
    sizes = prepare(engine, frames, batch_sizes)
    rounds = [measure_round(engine, frames, sizes, seconds, in_flight=in_flight) for _ in range(repeats)]
    return summarize(rounds, engine.backend, len(frames), seconds, engine.batch_sizes)


def _batch(frames: list[np.ndarray], start: int, size: int) -> list[np.ndarray]:
    return [frames[(start + i) % len(frames)] for i in range(size)]


def _timed_run(engine: Engine, frames: list[np.ndarray], size: int, seconds: float,
               min_batches: int, in_flight: int = 1) -> tuple[float, float, float]:
    """(fps, median ms per batch from submit to results, CPU ms per frame of this process).

    Keeps up to ``in_flight`` batches submitted; the clock stops when the last one's results are in.
    """
    times = []
    pending: deque[tuple[float, Any]] = deque()
    cpu0 = _cpu_s()
    started = time.perf_counter()
    submitted = 0
    while submitted < min_batches or time.perf_counter() - started < seconds:
        pending.append((time.perf_counter(), engine.submit(_batch(frames, submitted * size, size))))
        submitted += 1
        while len(pending) >= max(1, in_flight):
            _finish(pending, times)
    while pending:
        _finish(pending, times)
    elapsed = time.perf_counter() - started
    frames_done = submitted * size
    return frames_done / elapsed, float(np.median(times)) * 1e3, (_cpu_s() - cpu0) * 1e3 / frames_done


def _finish(pending: deque[tuple[float, Any]], times: list[float]) -> None:
    t0, handle = pending.popleft()
    handle.wait()
    times.append(time.perf_counter() - t0)


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def postprocess_timing(engine: Engine, frames: list[np.ndarray], boxes: list[Letterbox], spec: ModelSpec,
                       conf: float, iou: float, max_detections: int, repeats: int = 30) -> dict[str, Any]:
    """:func:`decode_batch` on the engine's real outputs for the first 8 frames, next to that batch's inference.

    Also :func:`app.postprocess.bench.bench_postprocess` on synthetic outputs
    of the model's own shape with many candidates (a crowded scene).
    """
    size = min(8, len(frames))
    try:
        t0 = time.perf_counter()
        outputs = [np.array(o) for o in engine.submit(frames[:size]).wait()]  # the engine reuses its buffers
    except ValueError:  # an engine that takes fewer frames per call
        size = min(max(engine.batch_sizes), len(frames))
        t0 = time.perf_counter()
        outputs = [np.array(o) for o in engine.submit(frames[:size]).wait()]
    infer_ms = (time.perf_counter() - t0) * 1e3
    timings, found = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        dets = decode_batch(outputs, spec, boxes[:size], conf_threshold=conf, iou_threshold=iou,
                            class_ids_keep=None, max_detections=max_detections)
        timings.append((time.perf_counter() - t0) * 1e3)
        found = sum(len(d) for d in dets)
    result: dict[str, Any] = {
        "batch": size,
        "real_ms": {k: v for k, v in stat(timings, 3).items() if k != "runs"},
        "real_detections_per_frame": round(found / size, 1),
        "infer_ms_same_batch": round(infer_ms, 1),
    }
    if spec.layout in ("yolov5", "yolov8") and outputs:
        from app.postprocess.bench import bench_postprocess

        boxes_per_frame = outputs[0].shape[1] if spec.layout == "yolov5" else outputs[0].shape[2]
        synthetic = bench_postprocess(layout=spec.layout, batch=size, boxes=boxes_per_frame,
                                      candidates_per_frame=min(2000, boxes_per_frame // 4), repeats=repeats)
        result["synthetic_crowded_ms"] = synthetic["median_ms"]
        result["synthetic_candidates_per_frame"] = min(2000, boxes_per_frame // 4)
    return result
