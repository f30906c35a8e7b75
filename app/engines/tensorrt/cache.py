"""The TensorRT engine cache: one file per (model, TensorRT, GPU, precision, profiles).

A serialized engine only runs with the TensorRT version and GPU it was built
for, and loading a wrong or damaged one can crash inside TensorRT rather than
raise. So every file starts with a header that repeats its full key and the
SHA-256 of the engine bytes, and a file whose header does not match, or whose
bytes do not hash to it, is rebuilt, never handed to TensorRT.

File layout::

    b"DSTRTENG" | u32 little-endian header length | header (JSON) | engine bytes

Writes go to a temporary file that is renamed into place, so a crash mid-write
leaves either the old file or none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"DSTRTENG"
FORMAT_VERSION = 1
_LENGTH = struct.Struct("<I")
_MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class EngineCacheKey:
    """Everything that makes a serialized engine valid; any change means a different engine."""

    onnx_sha256: str
    trt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: str
    profiles: tuple[tuple[int, int, int], ...]
    contexts: int = 1

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        data["profiles"] = [list(p) for p in self.profiles]
        return data

    def digest(self) -> str:
        canonical = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def cache_path(cache_dir: Path, model_name: str, key: EngineCacheKey) -> Path:
    """``<cache_dir>/<model>-<digest16>.engine``: readable, and distinct for every key."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_name).strip("_.") or "model"
    return cache_dir / f"{slug}-{key.digest()[:16]}.engine"


def read_cached(path: Path, key: EngineCacheKey) -> tuple[bytes | None, str]:
    """``(engine bytes, "")`` when ``path`` holds a valid engine for ``key``, else ``(None, why not)``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "not cached"
    except OSError as error:
        return None, f"unreadable ({error.strerror or error})"
    if not data.startswith(MAGIC):
        return None, "not a detstream engine file"
    if len(data) < len(MAGIC) + _LENGTH.size:
        return None, "truncated header"
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > _MAX_HEADER or start + length > len(data):
        return None, "truncated header"
    try:
        header = json.loads(data[start : start + length])
    except (ValueError, UnicodeDecodeError):
        return None, "corrupt header"
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        return None, "unknown header format"
    if header.get("key") != key.as_json():
        return None, f"built for another key ({_first_difference(header.get('key'), key.as_json())})"
    blob = data[start + length :]
    if len(blob) != header.get("engine_bytes") or hashlib.sha256(blob).hexdigest() != header.get("engine_sha256"):
        return None, "engine bytes truncated or corrupt"
    return blob, ""


def write_cached(path: Path, key: EngineCacheKey, blob: bytes) -> None:
    """Store ``blob`` under ``key`` atomically (temporary file + rename)."""
    header = json.dumps({
        "format": FORMAT_VERSION,
        "key": key.as_json(),
        "engine_bytes": len(blob),
        "engine_sha256": hashlib.sha256(blob).hexdigest(),
    }, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(MAGIC + _LENGTH.pack(len(header)) + header + blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_or_build(path: Path, key: EngineCacheKey, build: Callable[[], bytes]) -> bytes:
    """The cached engine for ``key``, or a fresh ``build()`` that is then cached (INFO says which and why)."""
    blob, reason = read_cached(path, key)
    if blob is not None:
        logger.info("using cached TensorRT engine %s", path)
        return blob
    logger.info("building TensorRT engine %s (%s); this can take minutes", path, reason)
    blob = build()
    write_cached(path, key, blob)
    return blob


def _first_difference(stored: object, wanted: dict[str, object]) -> str:
    if not isinstance(stored, dict):
        return "no key"
    for name, value in wanted.items():
        if stored.get(name) != value:
            return f"{name}: {stored.get(name)!r} != {value!r}"
    return "extra fields"
