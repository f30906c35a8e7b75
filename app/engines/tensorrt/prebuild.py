"""The ``build-engine`` command: build and cache a TensorRT engine ahead of time.

It writes the same cache file that ``create_engine`` looks up (see :mod:`app.engines.tensorrt.cache`),
so a pipeline started later with a matching key (batch ``1:max:max``, contexts, precision) skips the
build. Runs on the calling thread; a build takes minutes and is logged by phase.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.engines.cuda.device import CudaDevice
from app.engines.tensorrt.adapter import RealTrtRuntime, import_tensorrt
from app.engines.tensorrt.cache import EngineCacheKey, cache_path, write_cached
from app.engines.tensorrt.precision import model_for_precision
from app.engines.tensorrt.profiles import plan_profiles
from app.engines.tensorrt.runtime import BuildOptions
from app.errors import EngineLoadError, ModelError
from app.models.store.files import sha256_file
from app.types import ModelSpec

logger = logging.getLogger(__name__)


def build_engine_main(
    onnx_path: Path,
    *,
    fp16: bool,
    int8: bool,
    calib: Path | None,
    batch: tuple[int, int, int],
    cache_dir: Path,
    progress: bool,
    contexts: int = 2,
) -> Path:
    """The ``build-engine`` command: build the engine for ``onnx_path`` into ``cache_dir``; returns its file."""
    onnx_path, cache_dir = Path(onnx_path), Path(cache_dir).expanduser()
    try:
        device = CudaDevice.open()
        runtime = RealTrtRuntime(import_tensorrt())
    except EngineLoadError as error:
        raise EngineLoadError(f"build-engine needs an NVIDIA GPU with TensorRT ≥ 10: {error}") from None
    spec = _spec_from_onnx(onnx_path)
    precision = "int8" if int8 else "fp16" if fp16 else "fp32"
    if calib is not None:
        logger.warning("build-engine: --calib is not used: int8 engines build from the model that "
                       "'detstream quantize %s --calib %s' makes", onnx_path, calib)
    source = model_for_precision(onnx_path, precision, cache_dir)
    profiles = plan_profiles(*batch)
    key = EngineCacheKey(sha256_file(source), runtime.version, device.device_name(), device.compute_capability(),
                         precision, profiles, contexts)
    options = BuildOptions(spec.input_name, (spec.input_height, spec.input_width), precision, profiles, contexts,
                           timing_cache=cache_dir / "timing.cache", progress=progress)
    path = cache_path(cache_dir, source.stem, key)
    write_cached(path, key, runtime.build(source, options))
    logger.info("engine written to %s", path)
    return path


def _spec_from_onnx(onnx_path: Path) -> ModelSpec:
    """Input name and size straight from the ONNX file (the builder needs nothing else)."""
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as error:
        raise ModelError(f"{onnx_path}: not a readable ONNX model ({error})") from None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if not inputs:
        raise ModelError(f"{onnx_path}: the model has no input")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[2] <= 0 or dims[3] <= 0:
        raise ModelError(f"{onnx_path}: input {inputs[0].name} is {dims}; need N×3×H×W with fixed H and W")
    return ModelSpec(name=onnx_path.stem, path=str(onnx_path), input_name=inputs[0].name, input_height=dims[2],
                     input_width=dims[3], layout="yolov8", class_names=(),
                     static_batch=dims[0] if dims[0] > 0 else None)
