"""quantize_model on the tiny darknet net: fast, offline, and the same code path as the real model."""

from __future__ import annotations

import hashlib
import logging
import re

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.errors import ModelError
from app.models.darknet import convert_darknet
from app.models.provenance import stale_int8_reason
from app.models.quantize import default_output, quantize_model
from app.models.spec import load_model_spec
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


def dims(model: onnx.ModelProto) -> tuple[list, list]:
    shape = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    return shape(model.graph.input[0]), shape(model.graph.output[0])


def test_int8_keeps_the_dynamic_height_and_width_and_records_its_fp32_source(tiny_fp32, tmp_path):
    model, images = tiny_fp32
    out = quantize_model(model, images, tmp_path / "int8.onnx", frames=4)
    quantized = onnx.load(str(out))
    assert dims(quantized) == dims(onnx.load(str(model))) == (["batch", 3, "height", "width"], ["batch", "boxes", 7])
    meta = {p.key: p.value for p in quantized.metadata_props}
    assert meta["detstream.quantized_from"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert meta["detstream.stride"] == "2"
    spec = load_model_spec(out)
    assert (spec.dynamic_hw, spec.stride, spec.input_height, spec.input_width) == (True, 2, 32, 32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for height, width in ((32, 32), (28, 32), (16, 48)):
        got = session.run(None, {"images": np.full((1, 3, height, width), 0.5, np.float32)})[0]
        assert got.shape == (1, 2 * (height // 2) * (width // 2) + 2 * height * width, 7) and np.isfinite(got).all()


def test_a_folder_of_mixed_image_sizes_calibrates_a_dynamic_model(tiny_fp32, tmp_path, caplog):
    model, _ = tiny_fp32
    rng = np.random.default_rng(3)
    for i, (h, w) in enumerate([(40, 48), (48, 24), (32, 32), (20, 64)]):
        cv2.imwrite(str(tmp_path / f"{i}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    with caplog.at_level(logging.INFO, logger="app.models.quantize"):
        out = quantize_model(model, tmp_path, tmp_path / "mixed-int8.onnx", frames=4)
    assert "calibration frames at 10x32, 28x32, 32x16, 32x32" in caplog.text  # each image at its own rectangle
    batch = np.random.default_rng(1).uniform(0, 1, (1, 3, 32, 16)).astype(np.float32)
    fp32, int8 = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"images": batch})[0]
                  for p in (model, out))
    assert np.isfinite(int8).all() and np.abs(int8[..., 4:] - fp32[..., 4:]).mean() < 0.05


def test_an_int8_model_goes_stale_when_its_fp32_model_is_made_again(tiny_fp32, tmp_path):
    model, images = tiny_fp32
    fp32 = tmp_path / "tiny.onnx"
    fp32.write_bytes(model.read_bytes())
    int8 = quantize_model(fp32, images, frames=2)
    assert stale_int8_reason(int8, fp32) is None
    net = write_tiny_net(tmp_path, seed=7)  # another conversion: same graph, other weights
    convert_darknet(net.cfg, net.weights, net.names, fp32)
    assert re.fullmatch(r"was quantized from another tiny\.onnx \(sha256 [0-9a-f]{12}, the file now has "
                        r"[0-9a-f]{12}\)", stale_int8_reason(int8, fp32))
    assert stale_int8_reason(int8, tmp_path / "gone.onnx") is None  # nothing to compare with


@pytest.mark.parametrize(("metadata", "reason"), [
    ({"detstream.converter_version": "1"}, r"made from converter v1 output \(the current converter is v2\)"),
    ({"detstream.converter_version": "2"}, r"does not record which fp32 model it was quantized from"),
    ({}, r"does not record which fp32 model"),  # not a converter model: provenance is all there is
])
def test_an_int8_model_from_an_older_quantizer_or_converter_is_stale(tiny_fp32, tmp_path, metadata, reason):
    model, _ = tiny_fp32
    old = onnx.load(str(model))
    del old.metadata_props[:]
    onnx.helper.set_model_props(old, {"detstream.precision": "int8", **metadata})
    onnx.save(old, str(tmp_path / "old-int8.onnx"))
    assert re.match(reason, stale_int8_reason(tmp_path / "old-int8.onnx", model))
