"""GPU tests run only where TensorRT, cuda-python and an NVIDIA GPU are all usable; elsewhere they skip.

The check runs once per session and the reason is the skip message, so
``pytest -ra`` says exactly what is missing (``tensorrt is not installed``,
``no usable CUDA driver/GPU: ...``).
"""

from __future__ import annotations

import importlib

import pytest


def _why_no_gpu() -> str | None:
    try:
        importlib.import_module("tensorrt")
    except ImportError as error:
        return f"tensorrt is not installed: {error}"
    from app.engines import detect_cuda

    return detect_cuda()


@pytest.fixture(scope="session")
def gpu_missing_reason() -> str | None:
    return _why_no_gpu()


@pytest.fixture(autouse=True)
def _require_gpu(gpu_missing_reason: str | None) -> None:
    if gpu_missing_reason is not None:
        pytest.skip(f"needs an NVIDIA GPU with TensorRT: {gpu_missing_reason}")
