"""GPU tests run only where cuda-python and an NVIDIA GPU are usable; elsewhere they skip.

The check runs once per session and the reason is the skip message, so
``pytest -ra`` says exactly what is missing (``no usable CUDA driver/GPU: ...``).
Modules that need more than CUDA add their own check: TensorRT
(``test_tensorrt_gpu.py``) and ONNX Runtime's CUDA provider
(``test_onnxruntime_gpu.py``). The CUDA-only tests therefore run on a GPU
machine that has no TensorRT, as the lent GPU machine of this project does.
"""

from __future__ import annotations

import pytest


def _why_no_gpu() -> str | None:
    from app.engines import detect_cuda

    return detect_cuda()


@pytest.fixture(scope="session")
def gpu_missing_reason() -> str | None:
    return _why_no_gpu()


@pytest.fixture(autouse=True)
def _require_gpu(gpu_missing_reason: str | None) -> None:
    if gpu_missing_reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: {gpu_missing_reason}")
