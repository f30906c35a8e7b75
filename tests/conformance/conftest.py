"""Fixtures for the conformance tests: the real TensorRT 10 and 11 and cuda-bindings APIs (see real_bindings.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_bindings import BindingNames, Unreachable, full_strings, lean_api


@pytest.fixture(scope="session", params=[11, 10], ids=["trt11", "trt10"])
def real_trt(request: pytest.FixtureRequest) -> tuple[int, dict, BindingNames]:
    """``(major, lean runtime API dump, full bindings' strings)`` of the real TensorRT ``major``."""
    try:
        return request.param, lean_api(request.param), full_strings(request.param)
    except Unreachable as error:
        pytest.skip(f"PyPI unreachable, real TensorRT {request.param} bindings not available: {error}")
