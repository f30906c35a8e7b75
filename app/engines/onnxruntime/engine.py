"""OrtEngine: a model on ONNX Runtime with preallocated IO binding; the fallback when TensorRT is not usable.

The provider (TensorRT EP → CUDA EP → CPU EP, see :mod:`app.engines.onnxruntime.session`) is the one
ONNX Runtime really uses, read back from the session and named in :attr:`OrtEngine.backend`. It decides
how batches run:

* CPU provider: ``engine.onnxruntime.workers`` worker threads (``detstream.engine.ctx<i>``,
  :mod:`app.engines.onnxruntime.workers`) share one session whose intra-op pool has
  ``cores // workers`` threads. ``submit`` splits the batch into single-frame jobs (fixed-batch
  chunks for a model with a static batch > 1) and returns at once; frames are bound in place (no
  copy) and outputs land in rows of the current output set. Several single-frame runs on few threads
  each use a small CPU better than one batched run on all of them, and a batch brings nothing there.
* GPU providers (CUDA EP, TensorRT EP): one synchronous run per batch inside ``submit``, frames copied
  into one preallocated input array (concurrency is the GPU's business there). Every run has one
  shape, ``(max_batch, 3, H, W)`` at the nominal size, a smaller batch padded: a new shape makes the
  CUDA EP search cuDNN's convolution algorithms again (and the TensorRT EP build an engine), which
  costs far more than the padding.

Models whose input height and width are symbolic (``spec.dynamic_hw``) take frames letterboxed to any
multiple of ``spec.stride`` up to the nominal size (:attr:`OrtEngine.accepts_dynamic_hw`) on the CPU
provider only, for the same reason: on a GPU provider frames stay nominal.

No allocation in steady state: outputs are bound to preallocated sets
(:mod:`app.engines.onnxruntime.outputs`) that rotate, and the IO bindings are made once per (input
size, set, job or batch size) and reused. Where an output has a data-dependent size (e.g. an NMS
output whose row count depends on the image), ONNX Runtime allocates it per run instead.

Threading: ``submit`` runs on the engine thread (``detstream.engine``); ``handle.wait`` on the
postprocess thread; ``close`` on whoever owns the engine, after the engine thread has stopped submitting.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle, dynamic_batch_sizes, first_line
from app.engines.onnxruntime.outputs import OutputSets, ShapeEntry
from app.engines.onnxruntime.session import CPU, create_session, find_input, intra_op_threads
from app.engines.onnxruntime.workers import CpuWorkers, WorkerHandle
from app.engines.shapes import OutputShapes
from app.errors import EngineError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


class DoneHandle(InferenceHandle):
    """The handle of a batch that was computed inside ``submit`` (GPU providers)."""

    def __init__(self, outputs: list[np.ndarray]) -> None:
        self._outputs = outputs

    def wait(self) -> list[np.ndarray]:
        return self._outputs


class OrtEngine(Engine):
    """A model on ONNX Runtime (see the module docstring).

    ``in_flight`` is how many handles the caller may keep waiting in its queue
    (:attr:`app.config.EngineConfig.in_flight`); the outputs of a handle stay valid while that many
    more batches, plus one, are submitted, because the output sets rotate over ``in_flight + 2``.
    ``precision`` is ``engine.precision`` resolved for this engine (:func:`app.engines.selection.resolve_precision`);
    :attr:`precision` is what the provider really runs (:func:`reported_precision`), named in :attr:`backend`
    (``onnxruntime:<provider>:<precision>``). ``allow_spinning`` is the ``session.intra_op.allow_spinning``
    setting: off by default because, on a small CPU, spinning pool threads take the cores the decoder threads need.
    """

    def __init__(
        self,
        spec: ModelSpec,
        config: EngineConfig,
        providers: list[str] | None = None,
        *,
        allow_spinning: bool = False,
        precision: str | None = None,
    ) -> None:
        import onnxruntime as ort

        self.spec = spec
        self._config = config
        self._session = create_session(ort, spec, config, providers, allow_spinning)
        self.provider = self._session.get_providers()[0]
        self.precision = reported_precision(self.provider, precision or config.precision)
        self.backend = f"onnxruntime:{self.provider}:{self.precision}"
        self._what = f"{self.backend}: inference failed on {spec.path}"
        model_input = find_input(self._session, spec)
        self._dtype = np.dtype(_ORT_TYPES.get(model_input.type, np.float32))
        declared = model_input.shape[0]
        self.static_batch: int | None = declared if isinstance(declared, int) and declared > 0 else None
        symbolic_hw = not all(isinstance(d, int) and d > 0 for d in model_input.shape[2:])
        on_cpu = self.provider == CPU  # a GPU provider runs one padded, nominal shape (module docstring)
        self.accepts_dynamic_hw = spec.dynamic_hw and symbolic_hw and on_cpu
        self._max_batch = config.max_batch
        if self.static_batch is None:
            self.batch_sizes = dynamic_batch_sizes(config.max_batch) if on_cpu else (config.max_batch,)
            rows = config.max_batch
        else:
            self.batch_sizes = (self.static_batch,)
            self._max_batch = max(config.max_batch, self.static_batch)
            rows = math.ceil(self._max_batch / self.static_batch) * self.static_batch
        self._chunk = self.static_batch or 1
        self.in_flight = config.in_flight
        self._frame_size = 3 * spec.input_height * spec.input_width
        self._output_names = [o.name for o in self._session.get_outputs()]
        nominal = (spec.input_height, spec.input_width)
        types = [np.dtype(_ORT_TYPES.get(o.type, np.float32)) for o in self._session.get_outputs()]
        # resolve holds no reference to self: an engine dropped without close() is freed (and its workers
        # stopped) at once, not at the next garbage collection
        resolve = OutputShapes(Path(spec.path), spec, self._output_names)
        self._outputs = OutputSets(self.in_flight + 2, rows, self._chunk, nominal, resolve(nominal), types, resolve)
        self._set = 0
        self._closed = False
        self._lock = threading.Lock()
        self._staging: list[np.ndarray | None] = [None] * self._outputs.count  # input rows, per set, when needed
        self._last: list[WorkerHandle | None] = [None] * self._outputs.count
        self._spans = np.zeros((self._outputs.count, rows, 3))  # per job: start, end, CPU s
        self._workers: CpuWorkers | None = None
        if on_cpu:
            one_thread = intra_op_threads(config, CPU) == 1
            self._workers = CpuWorkers(self._session, spec.input_name, self._dtype, config.onnxruntime.workers,
                                       measure_cpu=one_thread)
            self.batch_window = False  # every frame runs alone: waiting for company only adds latency
            weakref.finalize(self, self._workers.close)  # an engine dropped without close() still stops its threads

    @property
    def output_sets(self) -> int:
        """How many output sets rotate (``in_flight + 2``)."""
        return self._outputs.count

    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        """Runs on the engine thread: check the frames, then queue per-frame jobs (CPU) or run the batch (GPU)."""
        hw = self._check(frames)
        with self._lock:
            if self._closed:
                raise EngineError(f"{self.backend}: submit after close")
            entry = self._outputs.entry(hw)
            self._set = (self._set + 1) % self._outputs.count  # earlier handles may still be read
            if self._workers is not None:
                return self._queue_jobs(self._workers, frames, entry, self._set)
            try:
                return DoneHandle(self._run_batch(frames, entry, self._set))
            except EngineError:
                raise
            except Exception as error:
                raise EngineError(f"{self._what}: {first_line(error)}") from error

    def warmup(self) -> None:
        """Run every worker (twice, at the nominal size) so that the first frames are not slow."""
        zeros = np.zeros((3, self.spec.input_height, self.spec.input_width), np.float32)
        workers = self._workers.count if self._workers is not None else 1
        frames = [zeros] * max(1, min(self._max_batch, workers * self._chunk))
        for _ in range(2):
            self.submit(frames).wait()

    def wait_for_room(self, stop: threading.Event) -> int:
        """CPU workers: wait until a worker lacks a job waiting behind its run (see :meth:`Engine.wait_for_room`)."""
        if self._workers is None:
            return super().wait_for_room(stop)
        return self._workers.wait_for_room(stop, max(self.batch_sizes))

    def close(self) -> None:
        """Stop and join the worker threads (a run in progress finishes first), then release the session. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._workers is not None:
            self._workers.close()
        self._last = [None] * len(self._last)
        self._session = None

    def _check(self, frames: Sequence[np.ndarray]) -> tuple[int, int]:
        """The (height, width) of this batch; ValueError for a count, a shape or a mix the engine cannot run."""
        n = len(frames)
        if not 0 < n <= self._max_batch:
            raise ValueError(f"OrtEngine.submit: {n} frames (allowed 1..{self._max_batch})")
        shape = frames[0].shape
        for frame in frames:
            if frame.shape != shape:
                raise ValueError(f"OrtEngine.submit: frames of different shapes in one batch: {shape} and "
                                 f"{frame.shape}; every frame of a batch must have the same size")
        spec = self.spec
        if len(shape) != 3 or shape[0] != 3:
            raise ValueError(f"OrtEngine.submit: frames must be (3, height, width), got {shape}")
        if shape[1:] == (spec.input_height, spec.input_width):
            return spec.input_height, spec.input_width
        if not self.accepts_dynamic_hw:
            raise ValueError(f"OrtEngine.submit: frames are {shape}, the model input is fixed at "
                             f"(3, {spec.input_height}, {spec.input_width}) on {self.backend}")
        height, width = shape[1], shape[2]
        if not (0 < height <= spec.input_height and 0 < width <= spec.input_width
                and height % spec.stride == 0 and width % spec.stride == 0):
            raise ValueError(f"OrtEngine.submit: frames are {shape}; height and width must be multiples of "
                             f"{spec.stride} up to {spec.input_height}x{spec.input_width}")
        return height, width

    def _queue_jobs(self, workers: CpuWorkers, frames: Sequence[np.ndarray], entry: ShapeEntry, s: int) -> WorkerHandle:
        """CPU provider: one job per frame (per chunk for a fixed batch > 1), bound in place where possible."""
        previous = self._last[s]
        if previous is not None:
            previous.finished()  # its jobs use this set's bindings; normally long done
        chunk = self._chunk
        jobs = math.ceil(len(frames) / chunk)
        bindings = entry.bindings[s]
        for job in range(jobs):
            if job not in bindings:
                bindings[job] = self._bind(entry, s, job * chunk, chunk)
        staging = None
        if chunk > 1 or not all(f.dtype == self._dtype and f.flags.c_contiguous for f in frames):
            staging = self._staging_rows(s, entry.hw)
        handle = WorkerHandle(self._what, frames, chunk, jobs, bindings, entry.job_shape, staging,
                              entry.first_rows(s, len(frames)), self._spans[s])
        self._last[s] = handle
        workers.put(handle, jobs)
        return handle

    def _run_batch(self, frames: Sequence[np.ndarray], entry: ShapeEntry, s: int) -> list[np.ndarray]:
        """GPU providers: gather into the staging input, run once (or per fixed-size chunk), return views."""
        n = len(frames)
        rows = self._staging_rows(0, entry.hw)
        for i, frame in enumerate(frames):
            np.copyto(rows[i], frame, casting="same_kind")
        bindings = entry.bindings[s]
        if self.static_batch is None:
            runs = [(self._max_batch, 0, self._max_batch)]  # padding rows hold earlier frames, never read
        else:
            b = self.static_batch
            padded = math.ceil(n / b) * b
            rows[n:padded] = 0
            runs = [(-(chunk + 1), chunk * b, b) for chunk in range(padded // b)]
        parts = []
        for key, offset, count in runs:
            binding = bindings.get(key)
            if binding is None:
                binding = bindings[key] = self._bind(entry, s, offset, count)
            # Bound again for every run: on a GPU provider ONNX Runtime copies a host input to the device when it
            # is bound, not when it runs, so a reused binding would run on the frames of its first batch.
            source = rows[offset : offset + count]
            binding.bind_input(self.spec.input_name, "cpu", 0, self._dtype, source.shape, source.ctypes.data)
            self._session.run_with_iobinding(binding)
            if entry.outputs is None:
                parts.append(binding.copy_outputs_to_cpu())
        views = entry.first_rows(s, n)
        if views is not None:
            return views
        return [np.concatenate([part[i] for part in parts])[:n] for i in range(len(self._output_names))]

    def _bind(self, entry: ShapeEntry, s: int, offset: int, rows: int) -> Any:
        """An IO binding whose outputs are rows ``offset:offset+rows`` of set ``s``; the input is bound per run."""
        binding = self._session.io_binding()
        for index, name in enumerate(self._output_names):
            if entry.outputs is None:
                binding.bind_output(name, "cpu")
                continue
            out = entry.outputs[s][index][offset : offset + rows]
            binding.bind_output(name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
        return binding

    def _staging_rows(self, s: int, hw: tuple[int, int]) -> np.ndarray:
        """Set ``s``'s staging input as ``(rows, 3, h, w)`` rows, allocated on first need (engine thread)."""
        flat = self._staging[s]
        if flat is None:
            flat = self._staging[s] = np.zeros(self._outputs.rows * self._frame_size, self._dtype)
        return flat[: self._outputs.rows * 3 * hw[0] * hw[1]].reshape(self._outputs.rows, 3, *hw)





def reported_precision(provider: str, requested: str) -> str:
    """What ``provider`` really runs for ``requested``: the CPU and CUDA providers run the model file's own
    types (fp32, or int8 for the Q/DQ model); the TensorRT EP runs fp16 unless fp32 is asked for."""
    if requested == "int8":
        return "int8"
    if provider == "TensorrtExecutionProvider":
        return "fp32" if requested == "fp32" else "fp16"
    return "fp32"
