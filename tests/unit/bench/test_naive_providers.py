"""The tutorial loop runs where the pipeline's engine ran, read from the messages' ``engine`` field."""

from __future__ import annotations

import pytest

from app.bench.naive import naive_providers

GPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]


@pytest.mark.parametrize(("engine", "providers"), [
    ("tensorrt:fp16", GPU),
    ("onnxruntime:CUDAExecutionProvider:fp32", GPU),
    ("onnxruntime:TensorrtExecutionProvider:fp16", GPU),
    ("onnxruntime:CPUExecutionProvider:fp32", CPU),
    ("onnxruntime:CPUExecutionProvider", CPU),
    ("openvino:CPU:bf16", CPU),
    ("openvino:CPU:int8", CPU),
])
def test_the_tutorial_runs_on_the_device_the_engine_used(engine: str, providers: list[str]) -> None:
    assert naive_providers(engine) == providers
