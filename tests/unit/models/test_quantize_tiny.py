"""quantize_model on the tiny darknet net: fast, offline, and the same code path as the real model."""

from __future__ import annotations

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.errors import ModelError
from app.models.darknet import convert_darknet
from app.models.quantize import default_output, quantize_model
from tests.unit.models.tiny_darknet import write_tiny_net


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    net = write_tiny_net(folder)
    images = folder / "calib"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        cv2.imwrite(str(images / f"{i}.png"), rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
    return convert_darknet(net.cfg, net.weights, net.names, folder / "tiny.onnx"), images


def test_quantize_writes_int8_beside_the_model_with_metadata_and_a_float_decode(tiny_fp32):
    model, images = tiny_fp32
    out = quantize_model(model, images, frames=4)
    assert out == default_output(model) == model.with_name("tiny-int8.onnx")
    quantized = onnx.load(str(out))
    meta = {p.key: p.value for p in quantized.metadata_props}
    assert meta["detstream.precision"] == "int8" and meta["detstream.layout"] == "yolov5"
    ops = [n.op_type for n in quantized.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    head_outputs = {o for n in quantized.graph.node if n.name.startswith("head/") for o in n.output}
    assert not head_outputs & {n.input[0] for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    batch = np.random.default_rng(1).uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    fp32, int8 = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"images": batch})[0]
                  for p in (model, out))
    assert int8.shape == fp32.shape
    assert np.abs(int8[..., 4:] - fp32[..., 4:]).mean() < 0.05  # probabilities stay close


def test_quantizing_an_already_quantized_model_is_refused(tiny_fp32, tmp_path):
    model, images = tiny_fp32
    once = quantize_model(model, images, tmp_path / "once.onnx", frames=2)
    with pytest.raises(ModelError, match=r"once\.onnx: already quantized"):
        quantize_model(once, images, tmp_path / "twice.onnx", frames=2)


def test_zero_calibration_frames_is_refused(tiny_fp32, tmp_path):
    model, images = tiny_fp32
    with pytest.raises(ModelError, match=r"frames must be at least 1, got 0"):
        quantize_model(model, images, tmp_path / "x.onnx", frames=0)
