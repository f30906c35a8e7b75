"""Which ONNX file a TensorRT engine is built from, for the requested ``engine.precision``.

TensorRT builds strongly typed networks (see :mod:`app.engines.tensorrt.build`), so precision is a
choice of model file, made here:

* ``auto`` and ``fp16``: the fp16 copy of the model (:func:`app.models.quantization.fp16.fp16_model`,
  made on first use and cached by the model's content under ``<engine cache>/models``);
* ``int8``: the explicitly quantized model ``<model>-int8.onnx`` that ``detstream quantize`` writes
  beside the fp32 one (calibrated with the pipeline's letterbox), or the configured model when it is such
  a file; missing or stale, the engine is refused with the command that makes it;
* ``fp32``: the model itself;
* ``bf16``: refused (TensorRT here runs fp16), so ``create_engine`` falls back or the user changes it.
"""

from __future__ import annotations

from pathlib import Path

from app.errors import EngineLoadError, ModelError
from app.models.quantization.fp16 import fp16_model
from app.models.quantization.quantize import default_output
from app.models.store.provenance import stale_int8_reason

MODEL_PRECISION = {"auto": "fp16", "fp16": "fp16", "fp32": "fp32", "int8": "int8"}


def trt_precision(requested: str) -> str:
    """The precision TensorRT runs for ``engine.precision`` = ``requested``; :class:`EngineLoadError` if none."""
    if requested == "bf16":
        raise EngineLoadError("tensorrt here runs fp16, not bf16: set engine.precision to fp16 (or auto)")
    try:
        return MODEL_PRECISION[requested]
    except KeyError:
        raise EngineLoadError(f"tensorrt: unknown precision {requested!r} "
                              f"(one of {', '.join(MODEL_PRECISION)})") from None


def model_for_precision(model_path: Path, precision: str, cache_dir: Path, sha256: str | None = None) -> Path:
    """The ONNX file to build from for ``precision`` (a value of :data:`MODEL_PRECISION`)."""
    model_path = Path(model_path)
    if precision == "fp32":
        return model_path
    if precision == "fp16":
        try:
            return fp16_model(model_path, Path(cache_dir) / "models", sha256)
        except ModelError as error:
            raise EngineLoadError(f"tensorrt fp16: {error}") from None
    if precision == "int8":
        if model_path.stem.endswith("-int8"):
            return model_path  # the configured model is the quantized one already
        int8 = default_output(model_path)
        make = f"detstream quantize {model_path} --calib VIDEO_OR_DIR"
        if not int8.exists():
            raise EngineLoadError(f"tensorrt int8 builds from a quantized model; make {int8.name} with: {make}")
        stale = stale_int8_reason(int8, model_path)
        if stale:
            raise EngineLoadError(f"tensorrt int8: {int8.name} is stale ({stale}); remake it with: {make}")
        return int8
    raise EngineLoadError(f"tensorrt: unknown model precision {precision!r}")
