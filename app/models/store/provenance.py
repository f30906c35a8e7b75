"""Which fp32 file an INT8 model was quantized from, and whether it still matches.

An INT8 model is a frozen copy of one fp32 file: when the converter changes
(version 2 made the input size dynamic) or the fp32 model is re-made, an old
``yolov3-tiny-int8.onnx`` silently keeps the old graph (a fixed 416×416 input,
say) and its calibration. :func:`app.models.quantization.quantize.quantize_model` records
the fp32 file's sha256 as ``detstream.quantized_from``; this module compares
it, and the copied ``detstream.converter_version``, with what is on disk now.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from app.models.darknet.converter import CONVERTER_VERSION
from app.models.store.files import sha256_file

logger = logging.getLogger(__name__)

QUANTIZED_FROM = "detstream.quantized_from"
CALIBRATED_ON = "detstream.calibrated_on"
"""The file name of the footage an INT8 model was calibrated on (a video, or a folder of images)."""
CALIBRATION_FRAMES = "detstream.calibration_frames"
QUANTIZER_VERSION_KEY = "detstream.quantizer_version"
QUANTIZER_VERSION = "2"
"""``detstream.quantizer_version`` of what :func:`app.models.quantization.quantize.quantize_model` writes
now: version 2 keeps the stem (first convolution block) in fp32, which is faster and closer to fp32 than
version 1 (no key)."""


def _metadata(path: Path) -> dict[str, str] | None:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError, ValueError) as error:  # load_model_spec reports a damaged file properly
        logger.debug("%s: cannot read metadata: %s", path, error)
        return None
    return {prop.key: prop.value for prop in model.metadata_props}


def calibration_of(int8_path: Path) -> tuple[str, int] | None:
    """(file name of the calibration footage, frames) an INT8 model records; None when it records none
    (made before the keys existed) or cannot be read. Only the name is kept, never a path or a URL."""
    meta = _metadata(Path(int8_path)) or {}
    name = meta.get(CALIBRATED_ON)
    try:
        return (name, int(meta.get(CALIBRATION_FRAMES, "0"))) if name else None
    except ValueError:
        return name, 0


def stale_int8_reason(int8_path: Path, fp32_path: Path) -> str | None:
    """Why ``int8_path`` is out of date against ``fp32_path`` (one line), or None when it is current or cannot be told.

    Stale: it was quantized from another converter version's output, records
    no source at all (made before provenance was recorded), or records a
    different sha256 than ``fp32_path`` has now, or was made by an older
    quantizer (``detstream.quantizer_version``). Without ``fp32_path`` only
    the converter version can be checked.
    """
    meta = _metadata(Path(int8_path))
    if meta is None:
        return None
    version = meta.get("detstream.converter_version")
    if version is not None and version != CONVERTER_VERSION:
        return f"made from converter v{version} output (the current converter is v{CONVERTER_VERSION})"
    fp32_path = Path(fp32_path)
    if not fp32_path.is_file():
        return None
    source = meta.get(QUANTIZED_FROM)
    if source is None:
        return f"does not record which fp32 model it was quantized from (made before {QUANTIZED_FROM} existed)"
    current = sha256_file(fp32_path)
    if source != current:
        return f"was quantized from another {fp32_path.name} (sha256 {source[:12]}, the file now has {current[:12]})"
    made_by = meta.get(QUANTIZER_VERSION_KEY, "1")
    if made_by != QUANTIZER_VERSION:
        return (f"made by quantizer v{made_by} (the current one, v{QUANTIZER_VERSION}, keeps the first convolution "
                "block in fp32: faster and closer to fp32)")
    return None
