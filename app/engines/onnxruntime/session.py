"""The ONNX Runtime session: which provider, how many threads, which provider options.

Providers are tried in order TensorRT EP → CUDA EP → CPU EP. ONNX Runtime falls back silently when a
provider cannot load (missing CUDA libraries, no GPU), so the caller reads the provider really in use
back from ``session.get_providers()``, and the intra-op threads are sized again when a GPU provider
fell back to the CPU.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any

from app.config import EngineConfig
from app.engines.base import first_line
from app.errors import EngineLoadError, ModelError
from app.models.quantization.fp16 import fp16_model
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
CPU = "CPUExecutionProvider"


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


def intra_op_threads(config: EngineConfig, provider: str) -> int:
    """ONNX Runtime intra-op threads: configured, else the physical cores shared out over the CPU workers.

    On the CPU provider ``engine.onnxruntime.workers`` runs go on at once, each on ``cores // workers``
    threads; a GPU provider runs one batch at a time on all cores (its CPU threads only handle the few
    nodes left on the host).
    """
    settings = config.onnxruntime
    if settings.intra_op_threads:
        return settings.intra_op_threads
    return max(1, physical_cores() // settings.workers) if provider == CPU else physical_cores()


def create_session(ort: Any, spec: ModelSpec, config: EngineConfig, providers: list[str] | None, spin: bool) -> Any:
    """The session on the first provider that loads, its intra-op threads sized for the provider really in use."""
    wanted = list(providers) if providers is not None else list(DEFAULT_PROVIDERS)
    available = set(ort.get_available_providers())
    if providers is None and not _nvidia_driver_present():
        # Without a driver the GPU providers can only fail (loudly, and slowly): do not offer them.
        available -= {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
    chosen = [p for p in wanted if p in available] or [CPU]
    threads = intra_op_threads(config, chosen[0])
    model = model_file(spec, config.precision, chosen[0], config.tensorrt.engine_cache_dir)
    session = _load(ort, spec, config, chosen, threads, spin, model)
    fell_back = session.get_providers()[0] == CPU
    if fell_back and (intra_op_threads(config, CPU) != threads or model != spec.path):
        # A GPU provider fell back silently (e.g. CUDA libraries missing): the fp32 model, threads for the CPU.
        session = _load(ort, spec, config, [CPU], intra_op_threads(config, CPU), spin, spec.path)
    return session


def model_file(spec: ModelSpec, precision: str, provider: str, cache_dir: Path) -> str:
    """The ONNX file a session on ``provider`` loads: the fp16 copy on the CUDA provider for fp16/auto.

    The CUDA provider runs what the model declares, so fp16 there means the fp16 model
    (:func:`app.models.quantization.fp16.fp16_model`, cached by content, shared with TensorRT). The
    TensorRT provider converts by itself (``trt_fp16_enable``) and the CPU provider stays on fp32.
    """
    if provider != "CUDAExecutionProvider" or precision not in ("auto", "fp16"):
        return spec.path
    try:
        return str(fp16_model(Path(spec.path), cache_dir / "models", spec.sha256))
    except ModelError as error:
        logger.warning("onnxruntime: no fp16 model (%s); running %s in fp32", error, spec.path)
        return spec.path


def _load(ort: Any, spec: ModelSpec, config: EngineConfig, chosen: list[str], threads: int, spin: bool,
          model: str) -> Any:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_mem_pattern = True
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    try:
        configured = [_with_options(p, config) for p in chosen]
        return ort.InferenceSession(model, sess_options=options, providers=configured, **spec.ort_session_kwargs())
    except Exception as error:
        raise EngineLoadError(f"onnxruntime cannot load {model}: {first_line(error)}") from None


def _with_options(provider: str, config: EngineConfig) -> Any:
    """TensorRT EP options: fp16 as configured and its own engine cache, so a restart does not rebuild."""
    if provider != "TensorrtExecutionProvider":
        return provider
    cache = config.tensorrt.engine_cache_dir / "ort-trt"
    return (provider, {
        "trt_fp16_enable": config.precision != "fp32",
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


def find_input(session: Any, spec: ModelSpec) -> Any:
    for model_input in session.get_inputs():
        if model_input.name == spec.input_name:
            return model_input
    names = [i.name for i in session.get_inputs()]
    raise EngineLoadError(f"{spec.path}: no input named {spec.input_name!r} (inputs: {names})")

