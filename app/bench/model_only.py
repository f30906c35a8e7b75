"""The model-only reference: the engine alone on frames already letterboxed in memory.

The engine is the one ``detstream run`` builds (:func:`app.engines.create_engine`
with the run's engine settings), fed the arrays a decoder thread would put in
its ring slots: converted and letterboxed by the same functions, at the input
size the pipeline feeds (the clip's own rectangle when ``model.rect`` is on
and both model and engine take it). Two batches are kept in flight, as the
engine stage does while the postprocess thread collects the previous one. No
decoding, no queues, no postprocess: what is left is the most frames per
second the pipeline could reach on this machine.

Repeats are interleaved (every batch size once, then again), so that a noisy
minute on a shared machine does not land on one batch size only.
"""

from __future__ import annotations

import time
from collections import deque

import av
import numpy as np

from app.bench.results import BatchRate, ModelOnly, Precision, Spread
from app.config import DetstreamConfig
from app.engines.base import Engine, InferenceHandle
from app.preprocess import fit_input_size, letterbox_into
from app.ring import aligned_empty
from app.sources.rgb import RgbConverter

BATCH_SIZES = (1, 2, 4, 8)
IN_FLIGHT = 2
MIN_BATCHES = 3


def load_frames(clip: str, count: int, config: DetstreamConfig, engine: Engine) -> list[np.ndarray]:
    """The first ``count`` frames of ``clip``, letterboxed as the decoder threads do it for this engine."""
    spec = engine.spec
    rect = bool(config.model.rect and spec.dynamic_hw and engine.accepts_dynamic_hw)  # the pipeline's rule
    frames = []
    rgb = RgbConverter()
    with av.open(clip) as container:
        for frame in container.decode(video=0):
            height, width = fit_input_size(frame.width, frame.height, spec.input_width, spec.input_height,
                                           spec.stride, rect)
            fmt = engine.frame_format
            slot = aligned_empty(fmt.shape(height, width), dtype=fmt.dtype)
            letterbox_into(rgb.convert(frame), slot, spec.scale)
            frames.append(slot)
            if len(frames) >= count:
                break
    if not frames:
        raise RuntimeError(f"{clip}: no frames decoded")
    return frames


def accepted_sizes(engine: Engine, frames: list[np.ndarray]) -> list[int]:
    """The sizes of :data:`BATCH_SIZES` that ``submit`` takes, each called once (the first call binds buffers)."""
    sizes = []
    for size in BATCH_SIZES:
        try:
            engine.submit(_batch(frames, 0, size)).wait()
        except ValueError:  # more frames than this engine takes in one call
            continue
        sizes.append(size)
    return sizes


def measure_round(engine: Engine, frames: list[np.ndarray], sizes: list[int],
                  seconds: float) -> dict[int, tuple[float, float]]:
    """One timed run per batch size: ``{size: (fps, median ms per batch from submit to results)}``."""
    return {size: _timed_run(engine, frames, size, seconds) for size in sizes}


def summarize(rounds: list[dict[int, tuple[float, float]]], precision: Precision, clip: str,
              engine: Engine, frames: list[np.ndarray]) -> ModelOnly:
    batches = {size: BatchRate(fps=Spread.of([r[size][0] for r in rounds]),
                               ms_per_batch=Spread.of([r[size][1] for r in rounds]))
               for size in rounds[0]}
    best = max(batches, key=lambda size: batches[size].fps.median or 0.0)
    height, width = engine.frame_format.hw(frames[0].shape)
    return ModelOnly(precision=precision, clip=clip, engine=engine.backend, input_hw=(height, width),
                     batches=batches, best_batch=best, best_fps=batches[best].fps)


def _batch(frames: list[np.ndarray], start: int, size: int) -> list[np.ndarray]:
    return [frames[(start + i) % len(frames)] for i in range(size)]


def _timed_run(engine: Engine, frames: list[np.ndarray], size: int, seconds: float) -> tuple[float, float]:
    times: list[float] = []
    pending: deque[tuple[float, InferenceHandle]] = deque()
    started = time.perf_counter()
    submitted = 0
    while submitted < MIN_BATCHES or time.perf_counter() - started < seconds:
        pending.append((time.perf_counter(), engine.submit(_batch(frames, submitted * size, size))))
        submitted += 1
        if len(pending) >= IN_FLIGHT:
            _finish(pending, times)
    while pending:
        _finish(pending, times)
    elapsed = time.perf_counter() - started
    return submitted * size / elapsed, float(np.median(times)) * 1e3


def _finish(pending: deque[tuple[float, InferenceHandle]], times: list[float]) -> None:
    t0, handle = pending.popleft()
    handle.wait()
    times.append(time.perf_counter() - t0)
