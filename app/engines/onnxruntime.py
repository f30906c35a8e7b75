"""OrtEngine: ONNX Runtime with preallocated IO binding; the fallback when TensorRT is not usable.

Providers are tried in order TensorRT EP → CUDA EP → CPU EP. ONNX Runtime
falls back silently when a provider cannot load (missing CUDA libraries, no
GPU), so the provider actually in use is read back from
``session.get_providers()`` and named in :attr:`OrtEngine.backend`.

Two ways to run, by provider:

* CPU provider: ``engine.contexts`` worker threads (``detstream.engine.ctx<i>``,
  :mod:`app.engines.ort_workers`) share one session whose intra-op pool has
  ``cores // contexts`` threads. ``submit`` splits the batch into single-frame
  jobs (fixed-batch chunks for a model with a static batch > 1) and returns at
  once; frames are bound in place (no copy) and outputs land in rows of the
  current output set. Measured on 2 cores: 2 concurrent single-frame runs on
  1 thread each beat one run on 2 threads, and batches > 1 bring nothing.
* GPU providers (CUDA EP, TensorRT EP): one synchronous run per batch inside
  ``submit``, frames copied into one preallocated input array (concurrency is
  the GPU's business there). Every run has one shape, ``(max_batch, 3, H, W)``
  at the nominal size: a smaller batch is padded. Measured on an H100 with the
  CUDA EP (onnxruntime-gpu 1.31, yolov3-tiny): a batch of 4 runs in 2.4 ms
  while the shape stays, but 186 ms when the batch size changes from run to
  run, because the CUDA EP searches cuDNN's convolution algorithms again for
  the new shape (36 ms with the ``HEURISTIC`` search); the TensorRT EP would
  build an engine per shape.

Models whose input height and width are symbolic (``spec.dynamic_hw``) take
frames letterboxed to any multiple of ``spec.stride`` up to the nominal size
(:attr:`OrtEngine.accepts_dynamic_hw`) on the CPU provider only, for the same
reason: on a GPU provider frames stay nominal.

No allocation in steady state: outputs are bound to preallocated sets
(:mod:`app.engines.ort_outputs`) that rotate, and the IO bindings are made
once per (input size, set, job or batch size) and reused. Where an output has
a data-dependent size (e.g. an NMS output whose row count depends on the
image), ONNX Runtime allocates it per run instead.

Threading: ``submit`` runs on the engine thread (``detstream.engine``);
``handle.wait`` on the postprocess thread; ``close`` on whoever owns the
engine, after the engine thread has stopped submitting.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle
from app.engines.ort_outputs import OutputSets, ShapeEntry
from app.engines.ort_shapes import OutputShapes
from app.engines.ort_workers import CpuWorkers, WorkerHandle, first_line
from app.errors import EngineError, EngineLoadError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
CPU = "CPUExecutionProvider"
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
    (``max(2, contexts)``); the outputs of a handle stay valid while that many
    more batches, plus one, are submitted, because the output sets rotate over
    ``in_flight + 2``. ``allow_spinning`` is the
    ``session.intra_op.allow_spinning`` setting: off by default because, on a
    small CPU, spinning pool threads take the cores the decoder threads need
    (docs/engines.md has the measurement). ``concurrent`` picks the way to
    run: None (default) uses the worker threads on the CPU provider and the
    synchronous path on GPU providers; False forces the synchronous path (the
    pre-worker behaviour, kept for measurements and tests); True forces
    workers (untested on GPU providers).
    """

    def __init__(
        self,
        spec: ModelSpec,
        config: EngineConfig,
        providers: list[str] | None = None,
        *,
        allow_spinning: bool = False,
        concurrent: bool | None = None,
    ) -> None:
        import onnxruntime as ort

        self.spec = spec
        self._config = config
        self._session = _create_session(ort, spec, config, providers, allow_spinning, concurrent)
        self.provider = self._session.get_providers()[0]
        self.backend = f"onnxruntime:{self.provider}"
        self._what = f"{self.backend}: inference failed on {spec.path}"
        model_input = _find_input(self._session, spec)
        self._dtype = np.dtype(_ORT_TYPES.get(model_input.type, np.float32))
        declared = model_input.shape[0]
        self.static_batch: int | None = declared if isinstance(declared, int) and declared > 0 else None
        symbolic_hw = not all(isinstance(d, int) and d > 0 for d in model_input.shape[2:])
        self._one_shape = self.provider != CPU  # a GPU provider runs one padded, nominal shape (module docstring)
        self.accepts_dynamic_hw = spec.dynamic_hw and symbolic_hw and not self._one_shape
        self._max_batch = config.max_batch
        if self.static_batch is None:
            self.batch_sizes = (config.max_batch,) if self._one_shape else dynamic_batch_sizes(config.max_batch)
            rows = config.max_batch
        else:
            self.batch_sizes = (self.static_batch,)
            self._max_batch = max(config.max_batch, self.static_batch)
            rows = math.ceil(self._max_batch / self.static_batch) * self.static_batch
        self._chunk = self.static_batch or 1
        self.in_flight = max(2, config.contexts)
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
        if concurrent if concurrent is not None else self.provider == CPU:
            one_thread = self.provider == CPU and intra_op_threads(config, CPU, concurrent) == 1
            self._workers = CpuWorkers(self._session, spec.input_name, self._dtype, config.contexts,
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
        room = self._workers.wait_for_room(stop)
        return min(room, max(self.batch_sizes)) if room else 0

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
            size = self._max_batch if self._one_shape else n  # padding rows hold earlier frames, never read
            runs = [(size, 0, size)]
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


def dynamic_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch``, plus ``max_batch`` itself so the batcher can fill it."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads of one core count once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            cores.add(f"{package}:{(topology / 'core_id').read_text().strip()}")
        except OSError:
            cores.add(f"cpu{cpu}")
    return max(1, len(cores))


def intra_op_threads(config: EngineConfig, provider: str, concurrent: bool | None = None) -> int:
    """ONNX Runtime intra-op threads: configured, else the physical cores shared out over the CPU workers.

    On the CPU provider ``contexts`` runs go on at once, each on
    ``cores // contexts`` threads; the synchronous path (GPU providers) runs
    one batch at a time on all cores (a GPU provider's CPU threads only
    handle the few nodes left on the host).
    """
    if config.intra_op_threads:
        return config.intra_op_threads
    workers = concurrent if concurrent is not None else provider == CPU
    return max(1, physical_cores() // config.contexts) if workers else physical_cores()


def _create_session(ort: Any, spec: ModelSpec, config: EngineConfig, providers: list[str] | None, spin: bool,
                    concurrent: bool | None) -> Any:
    """The session on the first provider that loads, its intra-op threads sized for the provider really in use."""
    wanted = list(providers) if providers is not None else list(DEFAULT_PROVIDERS)
    available = set(ort.get_available_providers())
    if providers is None and not _nvidia_driver_present():
        # Without a driver the GPU providers can only fail (loudly, and slowly): do not offer them.
        available -= {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
    chosen = [p for p in wanted if p in available] or [CPU]
    threads = intra_op_threads(config, chosen[0], concurrent)
    session = _load(ort, spec, config, chosen, threads, spin)
    if session.get_providers()[0] == CPU and intra_op_threads(config, CPU, concurrent) != threads:
        # A GPU provider fell back silently (e.g. CUDA libraries missing): size the threads for the CPU workers.
        session = _load(ort, spec, config, [CPU], intra_op_threads(config, CPU, concurrent), spin)
    return session


def _load(ort: Any, spec: ModelSpec, config: EngineConfig, chosen: list[str], threads: int, spin: bool) -> Any:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_mem_pattern = True
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    try:
        configured = [_with_options(p, config) for p in chosen]
        return ort.InferenceSession(spec.path, sess_options=options, providers=configured, **spec.ort_session_kwargs())
    except Exception as error:
        raise EngineLoadError(f"onnxruntime cannot load {spec.path}: {first_line(error)}") from None


def _with_options(provider: str, config: EngineConfig) -> Any:
    """TensorRT EP options: fp16 as configured and its own engine cache, so a restart does not rebuild."""
    if provider != "TensorrtExecutionProvider":
        return provider
    cache = Path(config.cache_dir or Path.home() / ".cache" / "detstream" / "engines") / "ort-trt"
    return (provider, {
        "trt_fp16_enable": config.precision in ("fp16", "int8"),
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
    })


def _nvidia_driver_present() -> bool:
    """Whether the NVIDIA driver library loads (what every ONNX Runtime GPU provider needs first)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _find_input(session: Any, spec: ModelSpec) -> Any:
    for model_input in session.get_inputs():
        if model_input.name == spec.input_name:
            return model_input
    names = [i.name for i in session.get_inputs()]
    raise EngineLoadError(f"{spec.path}: no input named {spec.input_name!r} (inputs: {names})")

