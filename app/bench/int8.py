"""``--int8``: the INT8 model beside the fp32 one, made when it is missing or stale.

The INT8 model is ``<model>-int8.onnx`` beside the fp32 file, as
``detstream quantize`` writes it, calibrated here on frames spread over the
bench's first clip. Calibrate on your own cameras' footage with ``detstream
quantize --calib`` for a model you deploy (docs/models.md); the bench then
finds and uses it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.models.quantization.quantize import default_output, quantize_model
from app.models.store.provenance import stale_int8_reason

logger = logging.getLogger(__name__)


def ensure_int8(model_path: Path, calib: Path, frames: int) -> Path:
    """The INT8 model of ``model_path``, quantized now when missing or made from another fp32 file."""
    path = Path(default_output(model_path))
    if path.exists():
        stale = stale_int8_reason(path, model_path)
        if stale is None:
            return path
        logger.info("bench: %s is stale (%s): quantizing again", path.name, stale)
    logger.info("bench: quantizing %s on %d frames of %s", model_path.name, frames, calib.name)
    return Path(quantize_model(model_path, calib, path, frames=frames))
