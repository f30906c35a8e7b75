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
from app.models.darknet.converter import convert_darknet
from app.models.quantization.quantize import QuantOptions, default_output, quantize_model, stem_nodes
from app.models.spec import load_model_spec
from app.models.store.provenance import stale_int8_reason
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
    with caplog.at_level(logging.INFO, logger="app.models.quantization.quantize"):
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


def _graph(nodes: list, initializers: list | None = None) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializers or [])
    return helper.make_model(graph)


def test_the_stem_is_the_first_convolution_and_what_follows_it_alone(tiny_fp32):
    from onnx import helper, numpy_helper

    model, _ = tiny_fp32
    # the tiny net's first activation also feeds a later route, so the stem stops there, before the maxpool
    assert stem_nodes(onnx.load(str(model))) == ["L0/conv", "L0/leaky"]
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    silu = _graph([helper.make_node("Conv", ["images", "w"], ["c"], name="conv"),
                   helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
                   helper.make_node("Mul", ["c", "s"], ["out"], name="mul")], [w])
    assert stem_nodes(silu) == ["conv"]  # x * sigmoid(x) branches: the convolution alone
    chain = _graph([helper.make_node("Conv", ["images", "w"], ["c"], name="conv"),
                    helper.make_node("LeakyRelu", ["c"], ["l"], name="leaky"),
                    helper.make_node("MaxPool", ["l"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
                    helper.make_node("Conv", ["p", "w2"], ["out"], name="conv2")],
                   [w, numpy_helper.from_array(np.zeros((4, 4, 1, 1), np.float32), "w2")])
    assert stem_nodes(chain) == ["conv", "leaky", "pool"]
    scaled = _graph([helper.make_node("Mul", ["images", "k"], ["m"], name="scale"),
                     helper.make_node("Conv", ["m", "w"], ["out"], name="conv")],
                    [w, numpy_helper.from_array(np.array(1 / 255, np.float32), "k")])
    assert stem_nodes(scaled) == []  # no convolution reads the image directly: nothing to keep


def test_the_stem_stays_fp32_and_the_file_tells_onnx_runtime_to_leave_it_so(tiny_fp32, tmp_path):
    model, images = tiny_fp32
    out = quantize_model(model, images, tmp_path / "stem-int8.onnx", frames=2)
    quantized = onnx.load(str(out))
    first = next(n for n in quantized.graph.node if n.name == "L0/conv")
    weights = {init.name for init in quantized.graph.initializer}
    assert first.input[0] == "images" and first.input[1] in weights  # float image, float weights: no Q/DQ
    float_convs = [n.name for n in quantized.graph.node if n.op_type == "Conv" and n.input[1] in weights]
    assert float_convs == ["L0/conv"]  # every other convolution reads DequantizeLinear weights
    meta = {p.key: p.value for p in quantized.metadata_props}
    assert meta["detstream.quantizer_version"] == "2"
    assert load_model_spec(out).ort_disabled_optimizers == ("QDQPropagationTransformer",)
    plain = quantize_model(model, images, tmp_path / "plain-int8.onnx", frames=2,
                           options=QuantOptions(fp32_stem=False))
    first = next(n for n in onnx.load(str(plain)).graph.node if n.name == "L0/conv")
    assert first.input[0] != "images"  # fed by a DequantizeLinear
    assert load_model_spec(plain).ort_disabled_optimizers == ()
