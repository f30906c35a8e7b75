"""Concurrent inference jobs on one ONNX Runtime session: what a job does, and the handle it completes.

Why: on a small CPU one session whose intra-op pool spans every core loses
time in the synchronisation of its parallel sections; N runs at once, each on
cores/N intra-op threads, keep the cores busy instead (BENCHMARKS.md has
the figures). ``InferenceSession.run_with_iobinding`` releases
the GIL for the whole run and is thread-safe as long as every concurrent run
has its own ``IOBinding``, so N Python threads share one session (one copy of
the weights, one arena). The threads, their FIFO and the handles' counting are
:mod:`app.engines.frame_workers`, shared with OpenVINO.

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

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engines.frame_workers import FrameWorkers, JobHandle


class WorkerHandle(JobHandle):
    """One submitted batch: ``jobs`` jobs of ``chunk`` frames each, bound through ``bindings``.

    ``spans`` holds each job's ``time.perf_counter()`` start and end of the
    run and the CPU seconds its thread spent in it (rows of a preallocated
    array, valid as long as the outputs), for metrics and tests.
    """

    __slots__ = ("bindings", "chunk", "input_shape", "spans", "staging")

    def __init__(self, what: str, frames: Sequence[np.ndarray], chunk: int, jobs: int, bindings: dict[int, Any],
                 input_shape: tuple[int, ...], staging: np.ndarray | None, outputs: list[np.ndarray] | None,
                 spans: np.ndarray) -> None:
        super().__init__(what, frames, jobs, outputs)
        self.chunk = chunk
        self.bindings = bindings
        self.input_shape = input_shape
        self.staging = staging
        self.spans = spans

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds the worker threads spent running this batch's jobs (read after :meth:`wait`); None
        when the runs use more than their own thread (see :class:`CpuWorkers`)."""
        total = float(self.spans[: self.jobs, 2].sum())
        return None if total != total else total  # NaN: not measured


class CpuWorkers(FrameWorkers[WorkerHandle]):
    """``count`` threads running :class:`WorkerHandle` jobs on a shared session (see the module docstring).

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
        super().__init__(lambda: self._run, count, name)

    def close(self) -> None:
        """Fail the jobs not started yet, let running ones finish, join the threads, then release the
        session (freeing it under a run in progress would abort the process). Idempotent."""
        super().close()
        self._session = None

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
