"""Concurrent inference jobs on one ONNX Runtime session: the worker threads and the handles they complete.

Why: on a small CPU one session whose intra-op pool spans every core loses
time in the synchronisation of its parallel sections; N runs at once, each on
cores/N intra-op threads, keep the cores busy instead (BENCHMARKS.md has
the figures). ``InferenceSession.run_with_iobinding`` releases
the GIL for the whole run and is thread-safe as long as every concurrent run
has its own ``IOBinding``, so N Python threads share one session (one copy of
the weights, one arena).

A job is rows ``j*chunk .. (j+1)*chunk`` of one submitted batch (a single
frame unless the model has a fixed batch > 1). Its binding writes the outputs
straight into those rows of the batch's output set. The input is bound to the
frame's own memory (a ring slot; no copy) or, for fixed-batch chunks and
frames that are not contiguous or not the model's dtype, to rows of a staging
array the worker fills.

Threads: ``detstream.engine.ctx<i>``, owned by :class:`CpuWorkers` (started by
its constructor, joined by :meth:`CpuWorkers.close`). The engine thread
``detstream.engine`` queues jobs (:meth:`CpuWorkers.put`); the postprocess
thread calls :meth:`WorkerHandle.wait`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engines.base import InferenceHandle
from app.errors import EngineError
from app.threads import StageThread

logger = logging.getLogger(__name__)


class WorkerHandle(InferenceHandle):
    """One submitted batch: ``jobs`` jobs that workers complete in any order.

    ``spans`` holds each job's ``time.perf_counter()`` start and end of the
    run and the CPU seconds its thread spent in it (rows of a preallocated
    array, valid as long as the outputs), for metrics and tests.
    """

    __slots__ = ("_done", "_error", "_left", "_lock", "_parts", "_what", "bindings", "chunk", "done_at", "frames",
                 "input_shape", "jobs", "n", "outputs", "spans", "staging")

    # Two plain locks instead of an Event (a Condition and a deque each): _lock guards the count, _done is held
    # until the last job ends, so waiting is acquiring it. A submit then allocates a few hundred bytes.

    def __init__(self, what: str, frames: Sequence[np.ndarray], chunk: int, jobs: int, bindings: dict[int, Any],
                 input_shape: tuple[int, ...], staging: np.ndarray | None, outputs: list[np.ndarray] | None,
                 spans: np.ndarray) -> None:
        self._what = what
        self.frames = frames
        self.n = len(frames)
        self.chunk = chunk
        self.bindings = bindings
        self.input_shape = input_shape
        self.staging = staging
        self.outputs = outputs
        self.spans = spans
        self.jobs = jobs
        self._parts: list[list[np.ndarray]] | None = None if outputs is not None else [[] for _ in range(jobs)]
        self._left = jobs
        self.done_at: float | None = None  # time.monotonic() when the last job ended: the batch's inference time
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()

    def wait(self) -> list[np.ndarray]:
        """Block until every job is done (postprocess thread); raise :class:`EngineError` if one failed."""
        self.finished()
        if self._error is not None:
            raise EngineError(f"{self._what}: {first_line(self._error)}") from self._error
        if self.outputs is not None:
            return self.outputs
        parts = self._parts or []
        return [np.concatenate([part[i] for part in parts])[: self.n] for i in range(len(parts[0]))]

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds the worker threads spent running this batch's jobs (read after :meth:`wait`); None
        when the runs use more than their own thread (see :class:`CpuWorkers`)."""
        total = float(self.spans[: self.jobs, 2].sum())
        return None if total != total else total  # NaN: not measured

    def finished(self) -> None:
        """Block until every job is done, without looking at the result (the engine thread, before reusing a set)."""
        with self._done:
            pass

    def job_done(self, error: BaseException | None) -> None:
        """Runs on a worker thread (or the closing thread): count one job off, keeping the first error."""
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self.done_at = time.monotonic()
            self._done.release()

    def keep_outputs(self, job: int, outputs: list[np.ndarray]) -> None:
        """Outputs ONNX Runtime allocated for one job (data-dependent sizes only)."""
        if self._parts is not None:
            self._parts[job] = outputs


class CpuWorkers:
    """``count`` threads running jobs from one FIFO on a shared session (see the module docstring).

    ``measure_cpu``: the session runs on one intra-op thread, the calling worker's, so that thread's CPU
    time over a run is the run's whole cost; with more threads the pool's share would be missed, and a
    job's CPU stays NaN (unknown) instead.
    """

    def __init__(self, session: Any, input_name: str, dtype: np.dtype, count: int,
                 name: str = "detstream.engine", measure_cpu: bool = False) -> None:
        self._session = session
        self._measure_cpu = measure_cpu
        self._input_name = input_name
        self._dtype = dtype
        self._jobs: queue.SimpleQueue[tuple[WorkerHandle, int] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._taken = threading.Condition()  # notified whenever a worker takes a job: room for another
        self._closed = False
        self._threads = [StageThread(self._loop, f"{name}.ctx{i}") for i in range(count)]
        for thread in self._threads:
            thread.start()

    @property
    def count(self) -> int:
        return len(self._threads)

    def wait_for_room(self, stop: threading.Event, poll_s: float = 0.05) -> int:
        """Engine thread: block while every worker already has a job waiting behind its run; then how many
        more jobs keep each worker one job ahead (0 once ``stop`` is set or the workers are closed)."""
        with self._taken:
            while not stop.is_set() and not self._closed:
                room = self.count - self._jobs.qsize()
                if room > 0:
                    return room
                self._taken.wait(poll_s)
        return 0

    def put(self, handle: WorkerHandle, jobs: int) -> None:
        """Queue jobs ``0..jobs-1`` of ``handle`` (engine thread). Raises EngineError once closed."""
        with self._lock:
            if self._closed:
                raise EngineError("inference workers are closed")
            for job in range(jobs):
                self._jobs.put((handle, job))

    def close(self) -> None:
        """Fail the jobs not started yet, let running ones finish, join the threads. Idempotent.

        The session is released only after the join: freeing it under a run
        in progress would abort the process.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        closed = EngineError("engine closed before this frame ran")
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].job_done(closed)
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._session = None

    def _loop(self) -> None:
        """Runs on ``detstream.engine.ctx<i>``: take jobs until the sentinel."""
        try:
            while (item := self._jobs.get()) is not None:
                with self._taken:
                    self._taken.notify()
                handle, job = item
                error: BaseException | None = None
                try:
                    self._run(handle, job)
                except Exception as failure:  # reported by that handle's wait; the worker goes on
                    logger.debug("inference job %d failed: %s", job, failure)
                    error = failure
                finally:
                    handle.job_done(error)
        except Exception:
            logger.exception("inference worker %s crashed", threading.current_thread().name)

    def _run(self, handle: WorkerHandle, job: int) -> None:
        binding = handle.bindings[job]
        source = handle.frames[job] if handle.staging is None else self._stage(handle, job)
        binding.bind_input(self._input_name, "cpu", 0, self._dtype, handle.input_shape, source.ctypes.data)
        spans = handle.spans
        cpu = time.thread_time() if self._measure_cpu else 0.0
        spans[job, 0] = time.perf_counter()
        self._session.run_with_iobinding(binding)
        spans[job, 1] = time.perf_counter()
        spans[job, 2] = time.thread_time() - cpu if self._measure_cpu else np.nan
        if handle.outputs is None:
            handle.keep_outputs(job, binding.copy_outputs_to_cpu())

    @staticmethod
    def _stage(handle: WorkerHandle, job: int) -> np.ndarray:
        """Copy this job's frames into its staging rows (the padding of a last fixed-size chunk zeroed)."""
        start = job * handle.chunk
        rows = handle.staging[start : start + handle.chunk]  # type: ignore[index]
        count = max(0, min(handle.n - start, handle.chunk))
        for i in range(count):
            np.copyto(rows[i], handle.frames[start + i], casting="same_kind")
        rows[count:] = 0
        return rows


def first_line(error: BaseException) -> str:
    """The first line of an error's text (ONNX Runtime messages run to many lines), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
