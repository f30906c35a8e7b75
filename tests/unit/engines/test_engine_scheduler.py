"""The TensorRT path's scheduling on HostDevice + the fake TensorRT: buckets, overlap, order, graphs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from engine_fakes import FakeTrtRuntime
from engine_models import make_model, random_frames, reference
from host_device import HostDevice

from app.config import EngineConfig
from app.engines.tensorrt import TensorRTEngine, open_tensorrt_engine
from app.engines.tensorrt.profiles import bucket_sizes, choose_bucket, plan_profiles
from app.engines.tensorrt.runtime import BuildOptions
from app.engines.tensorrt.scheduler import plan_steps
from app.errors import EngineError
from app.types import ModelSpec


def _open(tmp_path: Path, device: HostDevice, runtime: FakeTrtRuntime, *, batch: int | None = None,
          **tensorrt: object) -> TensorRTEngine:
    spec = make_model(tmp_path / f"tiny-{batch}.onnx", batch)
    config = EngineConfig(max_batch=4, tensorrt={"contexts": 2, **tensorrt})
    return open_tensorrt_engine(spec, config, device, runtime, tmp_path / "cache")


def _close_to(outputs: list[np.ndarray], frames: np.ndarray) -> bool:
    expected = reference(frames)
    return all(o.shape == e.shape and np.allclose(o, e, atol=1e-6) for o, e in zip(outputs, expected, strict=True))


@pytest.mark.parametrize(
    ("n", "buckets", "bucket"),
    [(1, (1, 2, 4, 8), 1), (2, (1, 2, 4, 8), 2), (3, (1, 2, 4, 8), 4), (5, (1, 2, 4, 8), 8), (8, (1, 2, 4, 8), 8),
     (3, (1, 2, 4, 6), 4), (5, (1, 2, 4, 6), 6), (1, (4,), 4)],
)
def test_bucket_choice_is_the_smallest_bucket_that_holds_the_batch(n: int, buckets: tuple, bucket: int) -> None:
    assert choose_bucket(n, buckets) == bucket


def test_a_batch_larger_than_every_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the largest bucket 4"):
        choose_bucket(5, (1, 2, 4))


@pytest.mark.parametrize(
    ("low", "high", "sizes"),
    [(1, 8, (1, 2, 4, 8)), (1, 6, (1, 2, 4, 6)), (1, 1, (1,)), (3, 16, (3, 4, 8, 16)), (5, 5, (5,))],
)
def test_bucket_sizes_are_powers_of_two_between_the_profile_limits(low: int, high: int, sizes: tuple[int, ...]) -> None:
    assert bucket_sizes(low, high) == sizes


@pytest.mark.parametrize(
    ("batch", "profiles"),
    [((1, 4, 8), ((1, 4, 8),)), ((1, 8, 8), ((1, 8, 8),)), ((2, 2, 16), ((2, 2, 16),)),
     ((1, 8, 32), ((1, 4, 4), (5, 8, 16), (17, 32, 32))), ((1, 64, 64), ((1, 4, 4), (5, 16, 16), (17, 64, 64)))],
)
def test_wide_batch_ranges_get_several_profiles(batch: tuple[int, int, int], profiles: tuple) -> None:
    assert plan_profiles(*batch) == profiles


def test_an_inverted_batch_range_is_refused() -> None:
    with pytest.raises(ValueError, match="min <= opt <= max"):
        plan_profiles(4, 2, 8)


@pytest.mark.parametrize(
    ("n", "bucket", "static", "steps"),
    [(3, 4, None, [(0, 4)]), (1, 1, 1, [(0, 1)]), (3, 1, 1, [(0, 1), (1, 1), (2, 1)]), (3, 2, 2, [(0, 2), (2, 2)])],
)
def test_static_engines_run_in_steps_at_row_offsets(n: int, bucket: int, static: int | None, steps: list) -> None:
    assert plan_steps(n, bucket, static) == steps


@pytest.mark.parametrize("batch", [None, 1, 2])
def test_results_equal_the_numpy_computation_for_dynamic_and_static_engines(
    tmp_path: Path, device: HostDevice, batch: int | None
) -> None:
    engine = _open(tmp_path, device, FakeTrtRuntime(device), batch=batch)
    try:
        for n in (1, 3, 4, 2):
            frames = random_frames(n, seed=n)
            assert _close_to(engine.submit(list(frames)).wait(), frames)
    finally:
        engine.close()


def test_several_batches_run_at_once_on_different_contexts(tmp_path: Path, device: HostDevice) -> None:
    runtime = FakeTrtRuntime(device)
    engine = _open(tmp_path, device, runtime, contexts=3)
    runtime.exec_delay_s = 0.05  # slow only after warm-up
    try:
        batches = [random_frames(2, seed=s) for s in range(3)]  # the consumer still holds the warm-up's set
        handles = [engine.submit(list(frames)) for frames in batches]
        results = [handle.wait() for handle in handles]
        assert runtime.concurrency.peak >= 2
        assert all(_close_to(r, f) for r, f in zip(results, batches, strict=True))
    finally:
        engine.close()


def test_results_come_back_in_submission_order_with_the_right_values(tmp_path: Path, device: HostDevice) -> None:
    runtime = FakeTrtRuntime(device, exec_delay_s=0.0)
    engine = _open(tmp_path, device, runtime, contexts=2)
    runtime.exec_delay_s = 0.01
    try:
        pending: list[tuple[np.ndarray, object]] = []
        for seed in range(12):
            frames = random_frames(1 + seed % 4, seed=seed)
            pending.append((frames, engine.submit(list(frames))))
            if len(pending) == 2:  # the consumer lags one batch behind, like the postprocess thread
                frames0, handle0 = pending.pop(0)
                assert _close_to(handle0.wait(), frames0)
        for frames, handle in pending:
            assert _close_to(handle.wait(), frames)
    finally:
        engine.close()


def test_a_consumer_that_stops_waiting_makes_submit_fail_after_its_timeout(tmp_path: Path, device: HostDevice) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    runtime = FakeTrtRuntime(device)
    blob = runtime.build(Path(spec.path), _options(spec))
    config = EngineConfig(max_batch=4, tensorrt={"contexts": 1})
    engine = TensorRTEngine(spec, config, device, runtime.deserialize(blob), submit_timeout_s=0.2)
    try:
        engine.submit([random_frames(1)[0]])
        engine.submit([random_frames(1)[0]])  # contexts + 1 output sets: this one still fits
        with pytest.raises(EngineError, match="results are not being consumed"):
            engine.submit([random_frames(1)[0]])
    finally:
        engine.close()


def _options(spec: ModelSpec) -> BuildOptions:
    return BuildOptions(spec.input_name, (spec.input_height, spec.input_width), "fp16", ((1, 4, 4),), contexts=1)


def test_graph_replay_gives_the_same_results_as_plain_enqueue(tmp_path: Path) -> None:
    frames = [random_frames(n, seed=10 + n) for n in (1, 2, 3, 4, 3)]
    results = {}
    for graphs in (False, True):
        dev = HostDevice()
        (tmp_path / str(graphs)).mkdir()
        try:
            runtime = FakeTrtRuntime(dev)
            engine = _open(tmp_path / str(graphs), dev, runtime, cuda_graphs=graphs)
            launches_before = dev.calls("launch")
            results[graphs] = [[o.copy() for o in engine.submit(list(f)).wait()] for f in frames]
            replayed = dev.calls("launch") - launches_before
            engine.close()
        finally:
            dev.close()
        assert replayed == (len(frames) if graphs else 0)
    for plain, replay in zip(results[False], results[True], strict=True):
        for a, b in zip(plain, replay, strict=True):
            np.testing.assert_array_equal(a, b)


def test_failed_capture_logs_once_and_keeps_plain_enqueue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dev = HostDevice(fail_on={"capture": 1})
    try:
        engine = _open(tmp_path, dev, FakeTrtRuntime(dev))
        try:
            for n in (1, 1, 3, 3):
                frames = random_frames(n, seed=n)
                assert _close_to(engine.submit(list(frames)).wait(), frames)
            assert all(not slot.graphs for slot in engine._scheduler.slots)
        finally:
            engine.close()
    finally:
        dev.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "graph capture failed" in r.message]
    assert sorted(r.message.split("batch ")[1].split(" ")[0] for r in warnings) == ["1", "2", "4"]  # once per bucket


def test_a_failing_execution_surfaces_as_engine_error_on_wait(tmp_path: Path) -> None:
    dev = HostDevice()
    try:
        runtime = FakeTrtRuntime(dev)
        engine = _open(tmp_path, dev, runtime)
        dev._fail_on["execute"] = dev.calls("execute") + 1  # the next execution fails on its stream
        handle = engine.submit(list(random_frames(2)))
        with pytest.raises(EngineError, match="injected execute failure"):
            handle.wait()
        engine.close()
    finally:
        dev.close()


def test_close_releases_every_device_allocation_and_is_idempotent(tmp_path: Path, device: HostDevice) -> None:
    engine = _open(tmp_path, device, FakeTrtRuntime(device))
    engine.submit(list(random_frames(3))).wait()
    engine.close()
    engine.close()
    assert device._blocks == {}
    assert device._host_blocks == {}
