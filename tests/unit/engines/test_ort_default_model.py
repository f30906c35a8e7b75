"""OrtEngine's CPU workers on the real default model (yolov3-tiny, 416×416 nominal).

Results must equal a plain ``InferenceSession.run`` of the same frames; the
rectangular sizes run only when the file is the dynamic-H/W conversion (the
static one refuses them, which is checked too). Overlap of two frames is
asserted through the run spans the workers record, not through speed, so a
busy shared machine cannot fail it: with the GIL held during a run, the
second worker could not even record its start before the first run ended.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.config import EngineConfig
from app.engines.onnxruntime import CPU, OrtEngine
from app.engines.onnxruntime.workers import WorkerHandle
from app.errors import EngineError
from app.models.spec import load_model_spec
from app.types import ModelSpec

RECT_SIZES = [(320, 416), (192, 416), (416, 320)]


@pytest.fixture(scope="module")
def spec(default_model: Path) -> ModelSpec:
    return load_model_spec(default_model)


@pytest.fixture(scope="module")
def engine(spec: ModelSpec):
    engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=8,
                                          onnxruntime={"workers": 2, "intra_op_threads": 1}))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def session(spec: ModelSpec) -> ort.InferenceSession:
    return ort.InferenceSession(spec.path, providers=[CPU])


def _frames(n: int, hw: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, *hw), dtype=np.float32)


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [g.shape for g in got] == [w.shape for w in want]
    for mine, theirs in zip(got, want, strict=True):  # boxes in pixels, scores in 0..1
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_per_frame_runs_equal_one_session_run_at_the_nominal_size(
    engine: OrtEngine, session: ort.InferenceSession, spec: ModelSpec, n: int
) -> None:
    frames = _frames(n, (spec.input_height, spec.input_width), seed=n)
    _assert_same(engine.submit(list(frames)).wait(), session.run(None, {spec.input_name: frames}))


@pytest.mark.parametrize("hw", RECT_SIZES)
def test_rectangular_letterbox_sizes_equal_a_session_run_at_that_size(
    engine: OrtEngine, session: ort.InferenceSession, spec: ModelSpec, hw: tuple[int, int]
) -> None:
    if not spec.dynamic_hw:
        assert not engine.accepts_dynamic_hw
        with pytest.raises(ValueError, match="fixed at"):
            engine.submit(list(_frames(1, hw, seed=0)))
        pytest.skip(f"{spec.path} has a fixed input size; rectangular sizes need the dynamic conversion")
    assert engine.accepts_dynamic_hw
    frames = _frames(3, hw, seed=sum(hw))
    got = engine.submit(list(frames)).wait()
    boxes = 3 * (hw[0] // 32) * (hw[1] // 32) * (1 + 4)  # 3 anchors on the stride-32 and stride-16 grids
    assert got[0].shape == (3, boxes, 85)
    _assert_same(got, session.run(None, {spec.input_name: frames}))


def test_two_frames_run_at_the_same_time_on_two_workers(engine: OrtEngine, spec: ModelSpec) -> None:
    frames = list(_frames(2, (spec.input_height, spec.input_width), seed=9))
    overlaps = 0
    for _ in range(4):
        handle = engine.submit(frames)
        handle.wait()
        assert isinstance(handle, WorkerHandle)
        (start_a, end_a), (start_b, end_b) = handle.spans[:2, :2]
        overlaps += start_b < end_a and start_a < end_b
    assert overlaps >= 3, f"two single-frame jobs overlapped in only {overlaps} of 4 batches"


def test_a_batch_reports_its_inference_cpu_when_each_run_has_one_thread(engine: OrtEngine, spec: ModelSpec) -> None:
    """The workers' own CPU over their runs is what the frames cost (detstream_inference_cpu_seconds_total)."""
    frames = list(_frames(3, (spec.input_height, spec.input_width), seed=5))
    handle = engine.submit(frames)
    handle.wait()
    walls = handle.spans[:3, 1] - handle.spans[:3, 0]
    cpus = handle.spans[:3, 2]
    assert handle.cpu_s == pytest.approx(cpus.sum())
    assert np.all(cpus > 0.005), cpus  # a 416x416 yolov3-tiny run is tens of ms of arithmetic
    assert np.all(cpus <= walls * 1.05 + 0.002), (cpus, walls)  # one thread cannot use more CPU than wall time


def test_runs_on_more_threads_than_their_own_report_no_cpu(spec: ModelSpec) -> None:
    engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=2,
                                          onnxruntime={"workers": 1, "intra_op_threads": 2}))
    try:
        handle = engine.submit(list(_frames(1, (spec.input_height, spec.input_width), seed=6)))
        handle.wait()
        assert handle.cpu_s is None  # the pool thread's share would be missed: unknown, not too low
    finally:
        engine.close()


def test_close_with_frames_still_queued_neither_hangs_nor_crashes(spec: ModelSpec) -> None:
    engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=8,
                                          onnxruntime={"workers": 2, "intra_op_threads": 1}))
    threads = list(engine._workers._threads)  # type: ignore[union-attr]
    handle = engine.submit(list(_frames(8, (spec.input_height, spec.input_width), seed=3)))
    engine.close()  # two runs are in progress: they finish, the session is released after the join
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(EngineError, match="closed before this frame ran"):
        handle.wait()
