"""Known model names and where their files are (``models/`` by default)."""

from __future__ import annotations

from pathlib import Path

from app.errors import ModelError
from app.models.fetch import DEFAULT_MODEL_FILE, fetch_default_model, is_current

KNOWN_MODELS = {
    "yolov3-tiny": (DEFAULT_MODEL_FILE, "detstream models fetch"),
    "yolov3-tiny-int8": ("yolov3-tiny-int8.onnx",
                         "detstream quantize models/yolov3-tiny.onnx --calib VIDEO --out models/yolov3-tiny-int8.onnx"),
}


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".onnx") or "/" in name_or_path or "\\" in name_or_path


def resolve_model(name_or_path: str, models_dir: Path) -> Path:
    """A model file from a known name or a path; a clear error saying how to get a missing one."""
    if _looks_like_path(name_or_path):
        return Path(name_or_path).expanduser()
    if name_or_path not in KNOWN_MODELS:
        raise ModelError(f"unknown model {name_or_path!r}; known: {', '.join(KNOWN_MODELS)} (or give an .onnx path)")
    filename, how = KNOWN_MODELS[name_or_path]
    path = Path(models_dir) / filename
    if not path.exists():
        raise ModelError(f"model {name_or_path!r} is not in {models_dir}/ yet: run `{how}`")
    return path


def list_models(models_dir: Path) -> list[tuple[str, Path, bool, int]]:
    """(name, path, present, size in bytes) for every known model."""
    rows = []
    for name, (filename, _) in KNOWN_MODELS.items():
        path = Path(models_dir) / filename
        rows.append((name, path, path.exists(), path.stat().st_size if path.exists() else 0))
    return rows


def ensure_default_model(models_dir: Path, cache_dir: Path | None = None) -> Path:
    """The default model, fetched and converted first when missing or made by another converter version."""
    path = Path(models_dir) / DEFAULT_MODEL_FILE
    return path if is_current(path) else fetch_default_model(Path(models_dir), cache_dir)
