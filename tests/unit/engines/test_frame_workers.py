"""FrameWorkers without a model: per-thread job functions, one job ahead per worker, failures and close."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.engines.frame_workers import FrameWorkers, JobHandle
from app.errors import EngineError


def frames(n: int) -> list[np.ndarray]:
    return [np.full((1, 2), i, np.float32) for i in range(n)]


def test_each_worker_makes_its_job_function_once_and_the_outputs_come_back_in_frame_order() -> None:
    made: list[str] = []

    def worker():
        made.append(threading.current_thread().name)
        return lambda handle, job: handle.keep_outputs(job, [handle.frames[job] * 2])

    workers: FrameWorkers[JobHandle] = FrameWorkers(worker, 3)
    try:
        for _ in range(4):
            handle = JobHandle("test", frames(5), 5)
            workers.put(handle, 5)
            np.testing.assert_array_equal(handle.wait()[0], np.concatenate(frames(5)) * 2)
            assert handle.done_at is not None
        assert sorted(made) == [f"detstream.engine.ctx{i}" for i in range(3)]
    finally:
        workers.close()


def test_a_failed_job_fails_its_handle_only_and_the_worker_goes_on() -> None:
    def run(handle, job):
        if handle.frames[job][0, 0] == 1:
            raise RuntimeError("bad frame\nmore text")
        handle.keep_outputs(job, [handle.frames[job]])

    workers: FrameWorkers[JobHandle] = FrameWorkers(lambda: run, 1)
    try:
        bad = JobHandle("engine x: inference failed", frames(3), 3)
        workers.put(bad, 3)
        with pytest.raises(EngineError, match=r"^engine x: inference failed: bad frame$"):
            bad.wait()
        good = JobHandle("test", frames(1), 1)
        workers.put(good, 1)
        assert good.wait()[0].shape == (1, 2)
    finally:
        workers.close()


def test_wait_for_room_keeps_one_job_ahead_per_worker_and_close_fails_the_queued_ones() -> None:
    running, release = threading.Event(), threading.Event()

    def run(handle, job):
        running.set()
        release.wait(5)

    workers: FrameWorkers[JobHandle] = FrameWorkers(lambda: run, 2)
    stop = threading.Event()
    assert workers.wait_for_room(stop, most=8) == 2
    assert workers.wait_for_room(stop, most=1) == 1
    handle = JobHandle("test", frames(4), 4, outputs=[])
    workers.put(handle, 4)
    assert running.wait(5)
    threading.Timer(0.2, stop.set).start()  # two runs going, two jobs behind them: no room until stopped
    assert workers.wait_for_room(stop, most=8, poll_s=0.01) == 0 and stop.is_set()
    stop.clear()
    closer = threading.Thread(target=workers.close)
    closer.start()
    deadline = time.monotonic() + 5
    while not workers.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # close() drains the queue right after it marks itself closed; release the runs after that
    release.set()
    closer.join(5)
    assert not closer.is_alive() and workers.closed
    with pytest.raises(EngineError, match="closed before this frame ran"):
        handle.wait()
    assert workers.wait_for_room(stop, most=8) == 0
    with pytest.raises(EngineError, match="closed"):
        workers.put(JobHandle("test", frames(1), 1), 1)
