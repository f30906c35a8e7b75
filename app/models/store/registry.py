"""Known model names and where their files live (``models/`` by default).

A name is a promise about a file name and how to make it; the registry never
downloads on its own except through :func:`ensure_default_model`, which the
pipeline calls for the default model only. The INT8 model is made from the
default one by the operator, so the registry only warns when it no longer
matches it (:mod:`app.models.store.provenance`); it never re-quantizes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from app.errors import ModelError
from app.models.store.fetch import DEFAULT_MODEL_FILE, fetch_default_model, is_current
from app.models.store.provenance import stale_int8_reason

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "yolov3-tiny"
INT8_MODEL = "yolov3-tiny-int8"
INT8_MODEL_FILE = "yolov3-tiny-int8.onnx"

# name -> (file in the models dir, the command that makes it)
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    DEFAULT_MODEL: (DEFAULT_MODEL_FILE, "detstream models fetch"),
    INT8_MODEL: (INT8_MODEL_FILE, "detstream quantize"),
}


class ModelEntry(NamedTuple):
    """One row of ``detstream models list``; ``size`` is in bytes (0 when absent)."""

    name: str
    path: Path
    present: bool
    size: int


def looks_like_path(name_or_path: str) -> bool:
    """A path, not a registry name: ends in ``.onnx`` or contains a separator."""
    return name_or_path.lower().endswith(".onnx") or "/" in name_or_path or "\\" in name_or_path


def resolve_model(name_or_path: str, models_dir: Path) -> Path:
    """The model file for a known name or a path; a one-line :class:`ModelError` saying how to get a missing one.

    A path is returned as given (expanded); whether it is a usable model is
    for :func:`app.models.spec.load_model_spec` to say.
    """
    if looks_like_path(name_or_path):
        return Path(name_or_path).expanduser()
    if name_or_path not in KNOWN_MODELS:
        raise ModelError(f"unknown model {name_or_path!r}; known: {', '.join(KNOWN_MODELS)} (or give an .onnx path)")
    filename, how = KNOWN_MODELS[name_or_path]
    path = Path(models_dir) / filename
    if not path.is_file():
        raise ModelError(f"model {name_or_path!r} is not fetched yet: run `{how}` (looked for {path})")
    reason = stale_reason(name_or_path, models_dir)
    if reason:
        logger.warning("model %r (%s) is stale: %s", name_or_path, path, reason)
    return path


def requantize_command(models_dir: Path) -> str:
    """The command that re-makes the INT8 model from the current default one."""
    return f"detstream quantize {Path(models_dir) / DEFAULT_MODEL_FILE} --calib VIDEO_OR_IMAGE_DIR"


def stale_reason(name: str, models_dir: Path) -> str | None:
    """For the INT8 model: why it no longer matches the default model and how to re-make it; else None."""
    if name != INT8_MODEL:
        return None
    int8 = Path(models_dir) / INT8_MODEL_FILE
    reason = stale_int8_reason(int8, Path(models_dir) / DEFAULT_MODEL_FILE) if int8.is_file() else None
    return f"{reason}; re-make it with `{requantize_command(models_dir)}`" if reason else None


def list_models(models_dir: Path) -> list[ModelEntry]:
    """Every known model with its path, whether it is there, and its size."""
    rows = []
    for name, (filename, _) in KNOWN_MODELS.items():
        path = Path(models_dir) / filename
        present = path.is_file()
        rows.append(ModelEntry(name, path, present, path.stat().st_size if present else 0))
    return rows


def ensure_default_model(models_dir: Path, cache_dir: Path | None = None) -> Path:
    """The default model, fetched and converted first when missing, damaged or made by another converter version."""
    path = Path(models_dir) / DEFAULT_MODEL_FILE
    return path if is_current(path) else fetch_default_model(Path(models_dir), cache_dir)
