"""With a live stream, the engine thread takes a frame only when a CPU worker is about to need one.

Frames queued inside the engine cannot be dropped for staleness; frames left in
the batcher can. With runs slowed to 20 ms, 24 frames go through the real
Batcher, InferenceStage and OrtEngine: from a live stream the engine's job
queue never holds more than one frame per worker; from a file stream (nothing
to drop) batches stay large.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from engine_models import make_model

from app.batcher import Batcher
from app.config import EngineConfig
from app.engines.onnxruntime import OrtEngine
from app.engines.onnxruntime.workers import CpuWorkers
from app.metrics import PipelineMetrics
from app.ring import FrameRing
from app.stages.inference import END, InferenceStage
from app.types import FrameMeta, Letterbox

FRAMES = 24


@pytest.fixture
def slow_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each run takes 20 ms more; records how many jobs were waiting right after every put."""
    waiting: list[int] = []
    run, put = CpuWorkers._run, CpuWorkers.put

    def slow_run(self, handle, job):
        time.sleep(0.02)
        run(self, handle, job)

    def recording_put(self, handle, jobs):
        put(self, handle, jobs)
        waiting.append(self._jobs.qsize())

    monkeypatch.setattr(CpuWorkers, "_run", slow_run)
    monkeypatch.setattr(CpuWorkers, "put", recording_put)
    return waiting


def feed(batcher: Batcher, stop: threading.Event) -> None:
    for seq in range(FRAMES):
        slot = batcher.acquire("clip", stop)
        assert slot is not None
        slot.array[:] = 0.1
        now = time.monotonic()
        batcher.commit(slot, FrameMeta("clip", seq, None, time.time(), now, 0.0, Letterbox(1.0, 0, 0, 8, 8)))
    batcher.close_stream("clip")


def run_frames(tmp_path: Path, live: bool) -> tuple[list[int], list[int]]:
    """(published seqs, batch sizes) of FRAMES frames through the engine stage."""
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=8,
                                          onnxruntime={"workers": 2, "intra_op_threads": 1}))
    batcher = Batcher(FrameRing(32, 8, 8), max_batch=8, max_wait_s=0.05, quota=32)
    batcher.add_stream("clip", live=live, max_staleness_s=10.0)
    results: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    stage = InferenceStage(batcher, engine, results, PipelineMetrics(), stop)
    producer = threading.Thread(target=feed, args=(batcher, stop), daemon=True)
    producer.start()
    stage.start()
    seqs, sizes = [], []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        item = results.get(timeout=10)
        if item is END:
            break
        if item.handle is not None:
            outputs = item.handle.wait()
            np.testing.assert_allclose(outputs[0], 1.2, rtol=1e-5)  # mean 0.1 * 2 + 1
        seqs += [slot.meta.seq for slot in item.batch.slots]
        sizes.append(len(item.batch.slots))
        batcher.release(item.batch.slots)
    engine.close()
    return seqs, sizes


def test_live_frames_wait_in_the_batcher_with_one_frame_queued_per_worker(tmp_path: Path, slow_runs: list[int]):
    seqs, _ = run_frames(tmp_path, live=True)
    assert seqs == list(range(FRAMES))
    assert slow_runs and max(slow_runs) <= 2, f"jobs waiting behind the runs: {slow_runs}"


def test_file_frames_keep_full_batches(tmp_path: Path, slow_runs: list[int]):
    seqs, sizes = run_frames(tmp_path, live=False)
    assert seqs == list(range(FRAMES))
    assert max(sizes) > 2, f"batch sizes {sizes}"
