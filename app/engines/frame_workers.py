"""Single-frame jobs from one FIFO on N worker threads: the run loop the CPU backends share.

ONNX Runtime's CPU provider (:mod:`app.engines.onnxruntime.workers`) and OpenVINO
(:mod:`app.engines.openvino.engine`) both split a submitted batch into jobs (one per frame, or per fixed-size
chunk) and run them on ``count`` worker threads that take ``(handle, job)`` pairs from one FIFO: several
single-frame runs on a few cores each keep a small CPU busier than one batched run on all of them. Each job
counts itself off its :class:`JobHandle` when it ends, failed or not; the last one releases
:meth:`JobHandle.wait`, which raises :class:`~app.errors.EngineError` with the first failure.

:meth:`FrameWorkers.wait_for_room` keeps at most one job waiting behind each worker's run, so live frames wait
in the batcher, where the live drop policy applies, and not in this queue. :meth:`FrameWorkers.close` fails
the jobs not started yet, lets the running ones finish and joins the threads.

What a job does is the backend's: ``FrameWorkers(worker, ...)`` calls ``worker()`` once on each worker thread
and runs every job there with the function it returns, so per-thread state (an OpenVINO infer request per
input size) lives in that function's closure and needs no lock.

Threads: ``<name>.ctx<i>`` (``detstream.engine.ctx<i>``), owned by :class:`FrameWorkers` (started by its
constructor, joined by :meth:`FrameWorkers.close`). The engine thread calls :meth:`FrameWorkers.wait_for_room`
and :meth:`FrameWorkers.put`; the postprocess thread :meth:`JobHandle.wait`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

from app.engines.base import InferenceHandle, first_line
from app.errors import EngineError
from app.threads import StageThread

logger = logging.getLogger(__name__)


class JobHandle(InferenceHandle):
    """One submitted batch of ``n`` frames: ``jobs`` jobs that the workers complete in any order.

    ``outputs`` are the arrays the jobs write into in place (rows of preallocated output sets), returned as
    they are by :meth:`wait`; None when each job hands its own arrays to :meth:`keep_outputs` instead, and
    :meth:`wait` returns their concatenation (the first ``n`` rows). ``done_at`` is ``time.monotonic()`` when
    the last job ended: the batch's inference time.
    """

    __slots__ = ("_done", "_error", "_left", "_lock", "_parts", "_what", "done_at", "frames", "jobs", "n", "outputs")

    # Two plain locks instead of an Event (a Condition and a deque each): _lock guards the count, _done is held
    # until the last job ends, so waiting is acquiring it. A submit then allocates a few hundred bytes.

    def __init__(self, what: str, frames: Sequence[np.ndarray], jobs: int,
                 outputs: list[np.ndarray] | None = None) -> None:
        self._what = what
        self.frames = frames
        self.n = len(frames)
        self.jobs = jobs
        self.outputs = outputs
        self._parts: list[list[np.ndarray]] | None = None if outputs is not None else [[] for _ in range(jobs)]
        self._left = jobs
        self.done_at: float | None = None
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
        """The arrays one job made itself (where ``outputs`` is None; otherwise they are ignored)."""
        if self._parts is not None:
            self._parts[job] = outputs


H = TypeVar("H", bound=JobHandle)


class FrameWorkers(Generic[H]):
    """``count`` threads named ``<name>.ctx<i>`` running jobs from one FIFO (see the module docstring).

    ``worker`` runs once on each thread, before its first job, and returns the function that runs one job
    there: ``run(handle, job)``. An exception from it fails that job only (its handle's :meth:`JobHandle.wait`
    raises); the worker goes on.
    """

    def __init__(self, worker: Callable[[], Callable[[H, int], None]], count: int,
                 name: str = "detstream.engine") -> None:
        self._worker = worker
        self._jobs: queue.SimpleQueue[tuple[H, int] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders put against close, so that no job is queued after the drain
        self._taken = threading.Condition()  # notified whenever a worker takes a job: room for another
        self._closed = False
        self._threads = [StageThread(self._loop, f"{name}.ctx{i}") for i in range(count)]
        for thread in self._threads:
            thread.start()

    @property
    def count(self) -> int:
        """How many worker threads run jobs."""
        return len(self._threads)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun: :meth:`put` raises from then on."""
        return self._closed

    def wait_for_room(self, stop: threading.Event, most: int, poll_s: float = 0.05) -> int:
        """Engine thread: block while every worker already has a job waiting behind its run; then how many
        more jobs, at most ``most``, keep each worker one job ahead (0 once ``stop`` is set or closed)."""
        with self._taken:
            while not stop.is_set() and not self._closed:
                room = self.count - self._jobs.qsize()
                if room > 0:
                    return min(room, most)
                self._taken.wait(poll_s)
        return 0

    def put(self, handle: H, jobs: int) -> None:
        """Queue jobs ``0..jobs-1`` of ``handle`` (engine thread). Raises :class:`EngineError` once closed."""
        with self._lock:
            if self._closed:
                raise EngineError("inference workers are closed")
            for job in range(jobs):
                self._jobs.put((handle, job))

    def close(self) -> None:
        """Fail the jobs not started yet, let running ones finish, join the threads. Idempotent.

        What the jobs use (a session, compiled models) may be released only after this returns: freeing it
        under a run in progress can abort the process.
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

    def _loop(self) -> None:
        """Runs on ``<name>.ctx<i>``: take jobs until the sentinel."""
        try:
            run = self._worker()
            while (item := self._jobs.get()) is not None:
                with self._taken:
                    self._taken.notify()
                handle, job = item
                error: BaseException | None = None
                try:
                    run(handle, job)
                except Exception as failure:  # reported by that handle's wait; the worker goes on
                    logger.debug("inference job %d failed: %s", job, failure)
                    error = failure
                finally:
                    handle.job_done(error)
        except Exception:
            logger.exception("inference worker %s crashed", threading.current_thread().name)
