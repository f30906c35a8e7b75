"""The engine cache key and file: every key input matters; a bad file is rebuilt, never loaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from app.engines.tensorrt.cache import MAGIC, EngineCacheKey, cache_path, load_or_build, read_cached, write_cached

KEY = EngineCacheKey(
    onnx_sha256="ab" * 32, trt_version="10.13.3", gpu_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
    precision="fp16", profiles=((1, 8, 8),), contexts=2,
)
ENGINE = b"\x00serialized-engine\xff" * 50


@pytest.mark.parametrize(
    "change",
    [
        {"onnx_sha256": "cd" * 32},
        {"trt_version": "10.14.0"},
        {"gpu_name": "NVIDIA L4"},
        {"compute_capability": (8, 9)},
        {"precision": "int8"},
        {"profiles": ((1, 4, 8),)},
        {"profiles": ((1, 8, 8), (9, 16, 16))},
        {"contexts": 3},
    ],
)
def test_the_cache_key_changes_with_each_of_its_inputs(change: dict) -> None:
    other = dataclasses.replace(KEY, **change)
    assert other.digest() != KEY.digest()
    assert cache_path(Path("/c"), "m", other) != cache_path(Path("/c"), "m", KEY)


def test_the_cache_key_is_stable_across_calls() -> None:
    assert KEY.digest() == dataclasses.replace(KEY).digest()


def test_a_written_engine_reads_back_unchanged(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "yolo v8/n", KEY)
    assert path.name.startswith("yolo_v8_n-")
    write_cached(path, KEY, ENGINE)
    assert read_cached(path, KEY) == (ENGINE, "")


def _corrupt(data: bytes) -> bytes:
    return data[:-10] + bytes(b ^ 0xFF for b in data[-10:])


def _bad_header(data: bytes) -> bytes:
    return MAGIC + b"\x10\x00\x00\x00" + b"{not json at all" + data[-20:]


def _mismatched_header(data: bytes) -> bytes:
    start = len(MAGIC) + 4
    length = int.from_bytes(data[len(MAGIC) : start], "little")
    header = json.loads(data[start : start + length])
    header["key"]["trt_version"] = "10.0.0"
    raw = json.dumps(header).encode()
    return MAGIC + len(raw).to_bytes(4, "little") + raw + data[start + length :]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_corrupt, "truncated or corrupt"),
        (lambda d: d[: len(d) // 2], "truncated or corrupt"),
        (lambda d: d[:10], "truncated header"),
        (lambda d: b"", "not a detstream engine file"),
        (lambda d: b"plain serialized engine without header", "not a detstream engine file"),
        (_bad_header, "corrupt header"),
        (_mismatched_header, "built for another key (trt_version"),
    ],
)
def test_a_damaged_or_mismatched_cache_file_is_rebuilt_not_loaded(tmp_path: Path, damage, reason: str) -> None:
    path = cache_path(tmp_path, "model", KEY)
    write_cached(path, KEY, ENGINE)
    path.write_bytes(damage(path.read_bytes()))
    blob, why = read_cached(path, KEY)
    assert blob is None and reason in why
    rebuilt = b"fresh engine"
    assert load_or_build(path, KEY, lambda: rebuilt) == rebuilt
    assert read_cached(path, KEY) == (rebuilt, "")


def test_a_file_for_another_key_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "shared.engine"
    write_cached(path, dataclasses.replace(KEY, gpu_name="NVIDIA L4"), ENGINE)
    blob, why = read_cached(path, KEY)
    assert blob is None and "gpu_name" in why


def test_a_valid_cache_file_is_used_without_building(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "model", KEY)
    write_cached(path, KEY, ENGINE)

    def build() -> bytes:
        raise AssertionError("must not build")

    assert load_or_build(path, KEY, build) == ENGINE


def test_a_failed_build_leaves_no_cache_file(tmp_path: Path) -> None:
    path = cache_path(tmp_path, "model", KEY)

    def build() -> bytes:
        raise RuntimeError("builder out of memory")

    with pytest.raises(RuntimeError):
        load_or_build(path, KEY, build)
    assert list(tmp_path.iterdir()) == []
