"""OrtEngine on tiny onnx.helper models: results, batch splitting, allocation, errors.

Most tests run both ways of running (the ``run_path`` fixture): the CPU provider's worker threads and the
synchronous whole-batch path GPU providers use.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from engine_models import make_model, random_frames, reference

from app.config import EngineConfig
from app.engines.onnxruntime import OrtEngine, dynamic_batch_sizes, physical_cores
from app.errors import EngineLoadError


def _config(max_batch: int, workers: int = 2) -> EngineConfig:
    return EngineConfig(backend="onnxruntime", max_batch=max_batch,
                        onnxruntime={"workers": workers, "intra_op_threads": 1})


def _engine(tmp_path: Path, batch: int | None, max_batch: int = 5) -> OrtEngine:
    return OrtEngine(make_model(tmp_path / f"tiny-{batch}.onnx", batch), _config(max_batch))


def _assert_matches(outputs: list[np.ndarray], frames: np.ndarray) -> None:
    expected = reference(frames)
    assert [o.shape for o in outputs] == [e.shape for e in expected]
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [None, 1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_outputs_equal_the_numpy_computation_for_every_batch_size(
    tmp_path: Path, batch: int | None, n: int, run_path: str
) -> None:
    engine = _engine(tmp_path, batch)
    frames = random_frames(n, seed=n)
    _assert_matches(engine.submit(list(frames)).wait(), frames)


def test_backend_names_the_provider_onnxruntime_really_uses(tmp_path: Path) -> None:
    engine = _engine(tmp_path, None)
    assert engine.backend == f"onnxruntime:{engine.provider}:fp32"  # backend:device:precision
    assert engine.provider == engine._session.get_providers()[0]


@pytest.mark.parametrize(
    ("batch", "max_batch", "sizes"),
    [(None, 8, (1, 2, 4, 8)), (None, 6, (1, 2, 4, 6)), (None, 1, (1,)), (1, 8, (1,)), (2, 8, (2,))],
)
def test_cpu_batch_sizes_are_powers_of_two_up_to_max_batch_for_dynamic_and_the_fixed_size_for_static_models(
    tmp_path: Path, batch: int | None, max_batch: int, sizes: tuple[int, ...]
) -> None:
    assert _engine(tmp_path, batch, max_batch).batch_sizes == sizes


def test_static_batch_two_model_pads_an_odd_batch_and_drops_the_padding(
    tmp_path: Path, run_path: str
) -> None:
    engine = _engine(tmp_path, 2, max_batch=6)
    for _ in range(engine.output_sets):  # every set's staging rows hold 6 earlier frames
        engine.submit(list(random_frames(6, seed=3) + 1)).wait()
    frames = random_frames(5, seed=7)
    outputs = engine.submit(list(frames)).wait()
    assert outputs[0].shape == (5, 3)
    _assert_matches(outputs, frames)
    # the padding row was zeroed, so stale frames cannot leak into a later odd batch
    staging = engine._staging[engine._set if run_path == "workers" else 0]
    assert staging is not None
    assert not staging.reshape(-1, 3, 8, 8)[5].any()


def test_static_model_with_fewer_frames_after_more_returns_only_the_new_results(
    tmp_path: Path, run_path: str
) -> None:
    engine = _engine(tmp_path, 1)
    engine.submit(list(random_frames(5, seed=1))).wait()
    frames = random_frames(2, seed=2)
    _assert_matches(engine.submit(list(frames)).wait(), frames)


def test_more_frames_than_max_batch_are_refused(tmp_path: Path) -> None:
    engine = _engine(tmp_path, None, max_batch=2)
    with pytest.raises(ValueError, match="3 frames"):
        engine.submit(list(random_frames(3)))


@pytest.mark.parametrize(("run_path", "batch", "dynamic_hw", "hw"), [
    *[(path, batch, False, (32, 32)) for path in ("workers", "synchronous") for batch in (None, 1)],
    ("workers", None, True, (24, 32)), ("workers", 1, True, (32, 16)),  # GPU providers run the nominal size only
], indirect=["run_path"])
def test_steady_state_submits_neither_allocate_outputs_nor_grow_memory(
    tmp_path: Path, batch: int | None, dynamic_hw: bool, hw: tuple[int, int], run_path: str
) -> None:
    # 32x32 frames: one batch of outputs is ~48 KiB, far above what a submit may allocate transiently
    spec = make_model(tmp_path / "tiny32.onnx", batch, height=32, width=32, dynamic_hw=dynamic_hw)
    engine = OrtEngine(spec, _config(4))
    batches = [list(random_frames(n, seed=n, height=hw[0], width=hw[1])) for n in (1, 3, 4)]
    # Tracing starts before the warm-up: what steady state keeps (the last handle of each output set, ORT's
    # per-binding values) must be traced when made, or its replacement would look like growth. On worker threads
    # ONNX Runtime's Python layer (bind_input, run_with_iobinding) also keeps a bounded set of small objects that
    # fills during the first few hundred runs: measured up to ~12 KiB, then flat over 3000 more submits. So the
    # check is per submit (what one submit allocates at a time) plus bounded retained growth.
    tracemalloc.start()
    try:
        for frames in batches * 100:  # also the first use of each (size, set, job), which makes its binding
            engine.submit(frames).wait()
        gc.collect()
        before = tracemalloc.take_snapshot()
        transient = 0
        for i in range(200):
            start, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            engine.submit(batches[i % 3]).wait()
            _, peak = tracemalloc.get_traced_memory()
            transient = max(transient, peak - start)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert growth < 16 * 1024, f"retained {growth} bytes more after 200 submits"
    assert transient < 8 * 1024, f"a submit allocated up to {transient} bytes"


def test_a_file_onnxruntime_cannot_load_raises_engine_load_error_naming_it(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "good.onnx", None)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not a protobuf")
    bad = type(spec)(**{**{f: getattr(spec, f) for f in spec.__slots__}, "path": str(broken)})
    with pytest.raises(EngineLoadError, match=r"onnxruntime cannot load .*broken\.onnx: .+"):
        OrtEngine(bad, EngineConfig(backend="onnxruntime"))


def test_an_input_name_the_model_lacks_is_a_load_error_listing_the_inputs(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    bad = type(spec)(**{**{f: getattr(spec, f) for f in spec.__slots__}, "input_name": "data"})
    with pytest.raises(EngineLoadError, match=r"no input named 'data' \(inputs: \['images'\]\)"):
        OrtEngine(bad, EngineConfig(backend="onnxruntime"))


@pytest.mark.parametrize(("max_batch", "expected"), [(1, (1,)), (2, (1, 2)), (5, (1, 2, 4, 5)), (16, (1, 2, 4, 8, 16))])
def test_dynamic_batch_sizes_table(max_batch: int, expected: tuple[int, ...]) -> None:
    assert dynamic_batch_sizes(max_batch) == expected


def test_physical_cores_is_at_least_one_and_at_most_the_logical_count() -> None:
    import os

    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_handle_keeps_its_outputs_while_in_flight_plus_one_more_batches_are_submitted(
    tmp_path: Path, workers: int, run_path: str
) -> None:
    """The pipeline queues ``in_flight`` handles, postprocesses one and submits one more: all must stay intact."""
    spec = make_model(tmp_path / "rotate.onnx", None)
    engine = OrtEngine(spec, _config(4, workers))
    assert (engine.in_flight, engine.output_sets) == (max(2, workers), max(2, workers) + 2)
    batches = [list(random_frames(2 + seed % 3, seed=seed)) for seed in range(engine.in_flight + 2)]
    handles = [engine.submit(frames) for frames in batches]
    for handle, frames in zip(handles, batches, strict=True):
        _assert_matches(handle.wait(), np.stack(frames))


def test_optimizers_the_model_file_disables_are_skipped_by_its_session(tmp_path: Path, monkeypatch) -> None:
    import dataclasses

    import onnxruntime

    seen: list[dict] = []

    class Recording(onnxruntime.InferenceSession):  # the real session, with its arguments noted
        def __init__(self, *args, **kwargs) -> None:
            seen.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Recording)
    spec = make_model(tmp_path / "tiny.onnx", None)
    plain = OrtEngine(spec, _config(2))
    assert "disabled_optimizers" not in seen[-1]
    asks = dataclasses.replace(spec, ort_disabled_optimizers=("QDQPropagationTransformer",))
    engine = OrtEngine(asks, _config(2))
    assert seen[-1]["disabled_optimizers"] == ["QDQPropagationTransformer"]
    frames = random_frames(2, seed=3)
    _assert_matches(engine.submit(list(frames)).wait(), frames)
    plain.close()
    engine.close()
