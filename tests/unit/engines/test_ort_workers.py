"""OrtEngine's CPU worker threads and rectangular inputs, on tiny onnx.helper models.

Reference results come from a plain ``InferenceSession.run`` on the same
frames (and from numpy, see engine_models), so per-frame concurrent runs must
give exactly what one batch run gives.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from engine_models import FAIL_AT, make_model, random_frames, reference

from app.config import EngineConfig
from app.engines.onnxruntime import CPU, OrtEngine, intra_op_threads, physical_cores
from app.engines.onnxruntime.outputs import MAX_SHAPES
from app.errors import EngineError


def _config(workers: int = 2) -> EngineConfig:
    return EngineConfig(backend="onnxruntime", max_batch=8, onnxruntime={"workers": workers, "intra_op_threads": 1})


def _direct(path: str, frames: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(path, providers=[CPU]).run(None, {"images": frames})


def _worker_threads() -> set[threading.Thread]:
    """Live engine worker threads (other tests' engines may still be alive: compare before and after)."""
    return {t for t in threading.enumerate() if t.name.startswith("detstream.engine.ctx")}


@pytest.mark.parametrize(("batch", "dynamic_hw"), [(None, False), (1, False), (None, True), (1, True)],
                         ids=["dynamic-batch", "static-1", "dynamic-hw", "static-1-dynamic-hw"])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_concurrent_per_frame_runs_equal_one_plain_session_run(
    tmp_path: Path, batch: int | None, dynamic_hw: bool, n: int
) -> None:
    spec = make_model(tmp_path / "tiny.onnx", batch, dynamic_hw=dynamic_hw)
    engine = OrtEngine(spec, _config(workers=2))
    frames = random_frames(n, seed=n)
    got = engine.submit(list(frames)).wait()
    direct = [np.concatenate([out for f in frames for out in _direct(spec.path, f[None])[i:i + 1]])
              for i in range(2)] if batch == 1 else _direct(spec.path, frames)
    for mine, theirs, numpy in zip(got, direct, reference(frames), strict=True):
        np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_allclose(mine, numpy, rtol=1e-5, atol=1e-6)
    engine.close()


@pytest.mark.parametrize("hw", [(12, 16), (8, 16), (16, 4), (4, 4), (16, 16)])
def test_rectangular_inputs_give_what_a_direct_run_at_that_size_gives(tmp_path: Path, hw: tuple[int, int]) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    assert engine.accepts_dynamic_hw
    for n in (1, 3):
        frames = random_frames(n, seed=n, height=hw[0], width=hw[1])
        got = engine.submit(list(frames)).wait()
        assert [g.shape for g in got] == [(n, 3), (n, 3, *hw)]
        for mine, theirs in zip(got, _direct(spec.path, frames), strict=True):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.usefixtures("gpu_provider_path")
def test_a_gpu_provider_runs_one_padded_nominal_shape_and_refuses_rectangles(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    assert (engine.accepts_dynamic_hw, engine.batch_sizes) == (False, (8,))
    with pytest.raises(ValueError, match=r"fixed at \(3, 16, 16\)"):
        engine.submit(list(random_frames(2, height=12, width=16)))
    frames = random_frames(3, height=16, width=16)
    for mine, theirs in zip(engine.submit(list(frames)).wait(), _direct(spec.path, frames), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_rectangular_outputs_are_views_of_the_preallocated_sets_not_new_arrays(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    for hw in ((16, 16), (8, 12)):
        outputs = engine.submit(list(random_frames(2, height=hw[0], width=hw[1]))).wait()
        assert all(out.base is not None and not out.flags.owndata for out in outputs)


def test_frames_of_different_shapes_in_one_submit_are_refused_naming_both(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    frames = [random_frames(1, height=16, width=16)[0], random_frames(1, height=8, width=16)[0]]
    with pytest.raises(ValueError, match=r"different shapes in one batch: \(3, 16, 16\) and \(3, 8, 16\)"):
        engine.submit(frames)


@pytest.mark.parametrize(("hw", "why"), [((10, 16), "multiples of 4"), ((20, 16), "up to 16x16"),
                                         ((16, 0), "multiples of 4")])
def test_sizes_a_dynamic_model_cannot_take_are_refused(tmp_path: Path, hw: tuple[int, int], why: str) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    with pytest.raises(ValueError, match=why):
        engine.submit([np.zeros((3, *hw), np.float32)])


def test_a_fixed_size_model_refuses_other_sizes(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "static.onnx", None, height=16, width=16)
    engine = OrtEngine(spec, _config())
    assert not engine.accepts_dynamic_hw
    with pytest.raises(ValueError, match=r"fixed at \(3, 16, 16\)"):
        engine.submit([np.zeros((3, 8, 16), np.float32)])


def test_a_spec_that_claims_dynamic_hw_for_a_fixed_size_file_is_not_believed(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "static.onnx", None, height=16, width=16)
    claimed = type(spec)(**{**{f: getattr(spec, f) for f in spec.__slots__}, "dynamic_hw": True})
    assert not OrtEngine(claimed, _config()).accepts_dynamic_hw


def test_input_sizes_kept_are_bounded_and_a_dropped_size_works_when_it_returns(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "dyn.onnx", None, height=16, width=16, dynamic_hw=True)
    engine = OrtEngine(spec, _config())
    sizes = [(h, w) for h in (4, 8, 12, 16) for w in (4, 8, 12, 16)]
    for hw in sizes * 2:
        frames = random_frames(2, seed=hw[0] * hw[1], height=hw[0], width=hw[1])
        np.testing.assert_allclose(engine.submit(list(frames)).wait()[1], reference(frames)[1], rtol=1e-6)
        assert len(engine._outputs._entries) <= MAX_SHAPES


def test_frames_that_are_not_contiguous_or_not_float32_are_copied_and_still_right(
    tmp_path: Path, run_path: str
) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OrtEngine(spec, _config())
    frames = random_frames(3, seed=5)
    strided = np.ascontiguousarray(frames.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert not strided[0].flags.c_contiguous
    for batch in (list(strided), [f.astype(np.float64) for f in frames]):
        for got, want in zip(engine.submit(batch).wait(), reference(frames), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_failing_run_fails_only_its_own_batch(tmp_path: Path, run_path: str) -> None:
    spec = make_model(tmp_path / "fragile.onnx", None, fragile=True)
    engine = OrtEngine(spec, _config())
    bad = random_frames(3, seed=1)
    bad[1, 0, 0, 0] = FAIL_AT
    good = random_frames(4, seed=2)
    if run_path == "synchronous":  # the synchronous path runs inside submit, so submit raises
        with pytest.raises(EngineError, match=r"inference failed on .*fragile\.onnx: .*Range"):
            engine.submit(list(bad))
    else:
        before = engine.submit(list(good))
        failed = engine.submit(list(bad))
        after = engine.submit(list(good))
        for _ in range(2):  # asking again gives the same error
            with pytest.raises(EngineError, match=r"inference failed on .*fragile\.onnx: .*Range"):
                failed.wait()
        for handle in (before, after):
            np.testing.assert_allclose(handle.wait()[0], reference(good)[0], rtol=1e-5)
    np.testing.assert_allclose(engine.submit(list(good)).wait()[0], reference(good)[0], rtol=1e-5)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_engine_owns_one_named_worker_per_worker_setting_and_close_joins_them(tmp_path: Path, workers: int) -> None:
    before = _worker_threads()
    engine = OrtEngine(make_model(tmp_path / "tiny.onnx", None), _config(workers=workers))
    mine = _worker_threads() - before
    assert sorted(t.name for t in mine) == [f"detstream.engine.ctx{i}" for i in range(workers)]
    handle = engine.submit(list(random_frames(8)))
    engine.close()
    assert not any(t.is_alive() for t in mine)
    try:  # jobs queued at close either ran or fail cleanly; nothing hangs
        handle.wait()
    except EngineError as error:
        assert "closed" in str(error)
    engine.close()  # idempotent
    with pytest.raises(EngineError, match="after close"):
        engine.submit(list(random_frames(1)))


@pytest.mark.usefixtures("gpu_provider_path")
def test_a_synchronous_engine_has_no_worker_threads(tmp_path: Path) -> None:
    before = _worker_threads()
    engine = OrtEngine(make_model(tmp_path / "tiny.onnx", None), _config())
    assert _worker_threads() == before
    engine.close()
    engine.close()


def test_an_engine_dropped_without_close_stops_its_workers_at_once(tmp_path: Path) -> None:
    before = _worker_threads()
    engine = OrtEngine(make_model(tmp_path / "tiny.onnx", None), _config(workers=2))
    engine.submit(list(random_frames(2))).wait()
    mine = _worker_threads() - before
    assert len(mine) == 2
    del engine  # no reference cycle: freed here, not at the next collection
    assert not any(t.is_alive() for t in mine)


def test_warmup_runs_at_the_nominal_size_on_every_worker(tmp_path: Path) -> None:
    engine = OrtEngine(make_model(tmp_path / "tiny.onnx", None), _config(workers=2))
    engine.warmup()
    handle = engine._last[engine._set]
    assert handle is not None and handle.n == 2  # one frame per worker
    engine.close()


@pytest.mark.parametrize(("configured", "workers", "provider", "expected"), [
    (None, 2, CPU, max(1, physical_cores() // 2)),
    (None, 1, CPU, physical_cores()),
    (None, 16, CPU, 1),
    (3, 2, CPU, 3),
    (None, 2, "CUDAExecutionProvider", physical_cores()),
])
def test_intra_op_threads_share_the_physical_cores_among_the_cpu_workers(
    configured: int | None, workers: int, provider: str, expected: int
) -> None:
    config = EngineConfig(backend="onnxruntime", onnxruntime={"workers": workers, "intra_op_threads": configured})
    assert intra_op_threads(config, provider) == expected


def test_gpu_providers_keep_all_cores_for_their_synchronous_runs() -> None:
    config = EngineConfig(backend="onnxruntime", onnxruntime={"workers": 4})
    assert intra_op_threads(config, "CUDAExecutionProvider") == physical_cores()


def test_a_batch_records_when_its_last_frame_finished_not_when_someone_waited_for_it(tmp_path: Path) -> None:
    """The published ``infer`` latency must not include time the batch spent waiting for the postprocess thread."""
    import time

    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OrtEngine(spec, _config(workers=2))
    submitted = time.monotonic()
    handle = engine.submit(list(random_frames(3, seed=1)))
    time.sleep(0.3)  # the postprocess thread is busy elsewhere
    handle.wait()
    waited = time.monotonic()
    assert handle.done_at is not None and submitted <= handle.done_at < waited - 0.2
    engine.close()
