"""OrtEngine: ONNX Runtime with preallocated IO binding; the fallback when TensorRT is not usable.

Providers are tried in order TensorRT EP → CUDA EP → CPU EP. ONNX Runtime
falls back silently when a provider cannot load (missing CUDA libraries, no
GPU), so the provider actually in use is read back from
``session.get_providers()`` and named in :attr:`OrtEngine.backend`.

No allocation in steady state: frames are copied into one preallocated input
array and outputs are bound to preallocated arrays; the IO bindings
themselves are made once per batch size (dynamic) or per chunk (static) and
reused. Where an output has a data-dependent size (e.g. an NMS output whose
row count depends on the image), ONNX Runtime allocates it per run instead.

Threading: ``submit`` runs on the engine thread (``detstream.engine``) and
computes synchronously; ONNX Runtime's own intra-op pool does the work.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle
from app.engines.ort_shapes import resolve_output_shapes
from app.errors import EngineError, EngineLoadError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


class DoneHandle(InferenceHandle):
    """The handle of a batch that was computed inside ``submit``."""

    def __init__(self, outputs: list[np.ndarray]) -> None:
        self._outputs = outputs

    def wait(self) -> list[np.ndarray]:
        return self._outputs


class OrtEngine(Engine):
    """A model on ONNX Runtime (see the module docstring).

    ``allow_spinning`` is the ``session.intra_op.allow_spinning`` setting: off by
    default because, on a small CPU, spinning pool threads take the cores the
    decoder threads need (docs/engines.md has the measurement).
    """

    def __init__(
        self,
        spec: ModelSpec,
        config: EngineConfig,
        providers: list[str] | None = None,
        *,
        allow_spinning: bool = False,
    ) -> None:
        import onnxruntime as ort

        self.spec = spec
        self._config = config
        self._session = _create_session(ort, spec, config, providers, allow_spinning)
        self.provider = self._session.get_providers()[0]
        self.backend = f"onnxruntime:{self.provider}"
        model_input = _find_input(self._session, spec)
        self._dtype = np.dtype(_ORT_TYPES.get(model_input.type, np.float32))
        declared = model_input.shape[0]
        self.static_batch: int | None = declared if isinstance(declared, int) and declared > 0 else None
        self._max_batch = config.max_batch
        if self.static_batch is None:
            cap = CPU_MAX_BATCH if self.provider == "CPUExecutionProvider" else config.max_batch
            self.batch_sizes = dynamic_batch_sizes(min(config.max_batch, cap))
            rows = config.max_batch
        else:
            self.batch_sizes = (self.static_batch,)
            self._max_batch = max(config.max_batch, self.static_batch)
            rows = math.ceil(self._max_batch / self.static_batch) * self.static_batch
        self._frame_shape = (3, spec.input_height, spec.input_width)
        self._input = np.zeros((rows, *self._frame_shape), self._dtype)
        self._output_names = [o.name for o in self._session.get_outputs()]
        trailing = resolve_output_shapes(Path(spec.path), spec, self._output_names)
        self._outputs: list[np.ndarray] | None = None
        self._output_sets: list[list[np.ndarray]] = []
        self._set = 0
        if all(shape is not None for shape in trailing):
            types = [np.dtype(_ORT_TYPES.get(o.type, np.float32)) for o in self._session.get_outputs()]
            self._output_sets = [[np.zeros((rows, *shape), t) for shape, t in zip(trailing, types, strict=True)]
                                 for _ in range(OUTPUT_SETS)]
            self._outputs = self._output_sets[0]
        self._bindings: list[dict[int, Any]] = [{} for _ in range(OUTPUT_SETS)]  # one per output set
        self._closed = False

    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        """Runs on the engine thread: gather, run (in static-size chunks when the model needs it), return views."""
        n = len(frames)
        if not 0 < n <= self._max_batch:
            raise ValueError(f"OrtEngine.submit: {n} frames (allowed 1..{self._max_batch})")
        for i, frame in enumerate(frames):
            np.copyto(self._input[i], frame, casting="same_kind")
        if self._output_sets:  # a new set: earlier handles may still be read by the postprocess thread
            self._set = (self._set + 1) % OUTPUT_SETS
            self._outputs = self._output_sets[self._set]
        try:
            outputs = self._run(key=n, offset=0, rows=n) if self.static_batch is None else self._run_chunks(n)
        except EngineError:
            raise
        except Exception as error:
            raise EngineError(f"{self.backend}: inference failed on {self.spec.path}: {_first_line(error)}") from error
        return DoneHandle(outputs)

    def _run_chunks(self, n: int) -> list[np.ndarray]:
        """Split ``n`` frames into static-size chunks (last one zero-padded) and stitch the outputs."""
        b = self.static_batch or 1
        padded = math.ceil(n / b) * b
        self._input[n:padded] = 0
        parts = [self._run(key=-(chunk + 1), offset=chunk * b, rows=b) for chunk in range(padded // b)]
        if self._outputs is not None:
            return [out[:n] for out in self._outputs]
        return [np.concatenate([part[i] for part in parts])[:n] for i in range(len(self._output_names))]

    def _run(self, key: int, offset: int, rows: int) -> list[np.ndarray]:
        """Run rows ``offset:offset+rows`` of the input through a binding made once for ``key``."""
        bindings = self._bindings[self._set]
        binding = bindings.get(key)
        if binding is None:
            binding = bindings[key] = self._bind(offset, rows)
        self._session.run_with_iobinding(binding)
        if self._outputs is not None:
            return [out[:rows] for out in self._outputs]
        return binding.copy_outputs_to_cpu()

    def _bind(self, offset: int, rows: int) -> Any:
        binding = self._session.io_binding()
        view = self._input[offset : offset + rows]
        binding.bind_input(self.spec.input_name, "cpu", 0, self._dtype, view.shape, view.ctypes.data)
        for index, name in enumerate(self._output_names):
            if self._outputs is None:
                binding.bind_output(name, "cpu")
                continue
            out = self._outputs[index][offset : offset + rows]
            binding.bind_output(name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
        return binding

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for bindings in self._bindings:
            bindings.clear()
        self._session = None


OUTPUT_SETS = 4
"""Preallocated output buffers rotate over this many sets, so a handle's arrays stay valid while
three more batches are submitted: the pipeline has at most two waiting for the postprocess thread,
one being postprocessed and one being computed (the results queue holds 2 for this engine)."""

CPU_MAX_BATCH = 4
"""Largest batch the pipeline gives the CPU provider. Measured on a 2-core AVX-512 machine with
yolov3-tiny 416: batch 8 is no faster per frame than 2 or 4 (about 33 fps each), but ONNX Runtime's
arena grows to batch 8's activations, about 120 MB more resident memory. ``submit`` still accepts up
to ``max_batch`` frames (the benchmark measures batch 8); batches the pipeline builds stop at 4."""


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


def _create_session(ort: Any, spec: ModelSpec, config: EngineConfig, providers: list[str] | None, spin: bool) -> Any:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = config.intra_op_threads or physical_cores()
    options.inter_op_num_threads = 1
    options.enable_mem_pattern = True
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    wanted = list(providers) if providers is not None else list(DEFAULT_PROVIDERS)
    available = set(ort.get_available_providers())
    if providers is None and not _nvidia_driver_present():
        # Without a driver the GPU providers can only fail (loudly, and slowly): do not offer them.
        available -= {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
    chosen = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
    try:
        configured = [_with_options(p, config) for p in chosen]
        return ort.InferenceSession(spec.path, sess_options=options, providers=configured)
    except Exception as error:
        raise EngineLoadError(f"onnxruntime cannot load {spec.path}: {_first_line(error)}") from None


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


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
