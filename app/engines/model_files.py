"""Which model file an engine loads for a precision: the INT8 (Q/DQ) model that ``detstream quantize`` writes
beside the fp32 one for ``int8``, the configured model otherwise.

TensorRT is not routed through here: it makes its precision from the model on its own side
(:mod:`app.engines.tensorrt`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.errors import EngineLoadError
from app.models.quantization.quantize import default_output
from app.models.spec import load_model_spec
from app.types import ModelSpec


class PrecisionUnavailable(EngineLoadError):
    """``engine.precision`` asks for a model file that is not there: no other backend could run it either."""


def model_for(spec: ModelSpec, precision: str) -> ModelSpec:
    """``spec`` for every precision but ``int8``; for ``int8`` the spec of the Q/DQ model beside it (names and
    layout kept), or :class:`PrecisionUnavailable` naming the command that makes it."""
    source = Path(spec.path)
    if precision != "int8" or source.stem.endswith("-int8"):
        return spec
    qdq = default_output(source)
    if not qdq.exists():
        raise PrecisionUnavailable(f"engine.precision: int8 runs the INT8 model {qdq}, which does not exist: make it "
                                   f"with `detstream quantize {source} --calib VIDEO_FROM_YOUR_CAMERAS`")
    quantized = load_model_spec(qdq)
    return replace(spec, path=str(qdq), sha256=quantized.sha256,
                   ort_disabled_optimizers=quantized.ort_disabled_optimizers)
