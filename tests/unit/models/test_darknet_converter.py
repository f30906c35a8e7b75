"""The darknet converter against an independent numpy forward pass, and its refusals."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.errors import ModelError
from app.models.darknet.cfg import apply_known_fixups, parse_cfg
from app.models.darknet.converter import build_darknet_model, convert_darknet, fold_batch_norm
from tests.unit.models.tiny_darknet import NAMES, TINY_CFG, parameter_count, ref_yolo, reference_forward, write_tiny_net


def run(path, batch: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["output"], {"images": batch.astype(np.float32)})[0]


@pytest.mark.parametrize(("height", "width"), [(32, 32), (30, 30), (32, 24)])
def test_converted_graph_matches_the_numpy_darknet_forward_pass(tmp_path, height, width):
    net = write_tiny_net(tmp_path, height, width)
    out = convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")
    images = np.random.default_rng(1).uniform(0, 1, (2, 3, height, width))
    got = run(out, images)
    for b in range(2):
        expected = reference_forward(net, images[b])
        assert got[b].shape == expected.shape
        np.testing.assert_allclose(got[b], expected, rtol=1e-4, atol=1e-4)


def dims(value_info: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_output_layout_metadata_and_dynamic_batch_height_and_width(tmp_path):
    net = write_tiny_net(tmp_path, 32, 32)
    out = convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")
    model = onnx.load(str(out))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["detstream.layout"] == "yolov5"
    assert meta["detstream.input_size"] == "32x32"  # the cfg's size: the nominal (largest) input
    assert meta["detstream.stride"] == "2"  # one stride-2 pool
    assert meta["detstream.converter_version"] == "2"
    assert json.loads(meta["detstream.class_names"]) == list(NAMES)
    assert meta["detstream.source"] == "darknet:tiny.cfg"
    assert float(meta["detstream.scale"]) == pytest.approx(1 / 255)
    assert (model.opset_import[0].version, model.ir_version) == (17, 8)
    assert dims(model.graph.input[0]) == ["batch", 3, "height", "width"]
    assert dims(model.graph.output[0]) == ["batch", "boxes", 5 + len(NAMES)]
    for batch, height, width in ((1, 32, 32), (3, 32, 32), (2, 16, 40)):
        boxes = 2 * (height // 2) * (width // 2) + 2 * height * width  # 2 anchors at stride 2, 2 at stride 1
        assert run(out, np.zeros((batch, 3, height, width))).shape == (batch, boxes, 5 + len(NAMES))


@pytest.mark.parametrize(("height", "width"), [(16, 48), (64, 32), (2, 2)])
def test_a_model_converted_at_one_size_matches_darknet_run_at_another_multiple_of_its_stride(tmp_path, height,
                                                                                           width):
    net = write_tiny_net(tmp_path, 32, 32)
    out = convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")
    images = np.random.default_rng(2).uniform(0, 1, (2, 3, height, width))
    got = run(out, images)
    for b in range(2):  # darknet's own forward pass for a cfg of this size (same weights)
        expected = reference_forward(replace(net, height=height, width=width), images[b])
        np.testing.assert_allclose(got[b], expected, rtol=1e-4, atol=1e-4)


# A pool without darknet's default padding drops a row: 30 -> 14, not 15, so 32 would not give 15 either.
UNEVEN_CFG = """[net]
width=30
height=30
channels=3

[maxpool]
size=3
stride=2
padding=0

[convolutional]
filters=7
size=1
stride=1
pad=1
activation=linear

[yolo]
mask = 0
anchors = 4,6
classes=2
num=1
"""


def test_a_cfg_whose_layer_sizes_do_not_scale_keeps_a_fixed_input_size(tmp_path):
    cfg, weights, names = tmp_path / "uneven.cfg", tmp_path / "uneven.weights", tmp_path / "uneven.names"
    cfg.write_text(UNEVEN_CFG)
    names.write_text("cat\ndog\n")
    header = np.array([0, 2, 0], "<i4").tobytes() + np.array([0], "<i8").tobytes()
    weights.write_bytes(header + np.random.default_rng(4).normal(0, 0.3, 7 + 7 * 3).astype("<f4").tobytes())
    model = build_darknet_model(cfg, weights, names)
    meta = {p.key: p.value for p in model.metadata_props}
    assert "detstream.stride" not in meta and meta["detstream.input_size"] == "30x30"
    assert dims(model.graph.input[0]) == ["batch", 3, 30, 30]
    assert dims(model.graph.output[0]) == ["batch", 14 * 14, 7]
    model.graph.output.append(onnx.helper.make_tensor_value_info("L1/conv", onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(5).uniform(0, 1, (1, 3, 30, 30)).astype(np.float32)
    out, raw = session.run(["output", "L1/conv"], {"images": images})
    assert raw.shape == (1, 7, 14, 14)
    np.testing.assert_allclose(out[0], ref_yolo(raw[0].astype(np.float64), (0,), [4, 6], 2, 30, 30), rtol=1e-5,
                               atol=1e-5)


def test_decode_nodes_are_named_head_so_the_quantizer_can_find_them(tmp_path):
    net = write_tiny_net(tmp_path)
    model = build_darknet_model(net.cfg, net.weights, net.names)
    ops_in_head = {n.op_type for n in model.graph.node if n.name.startswith("head/")}
    assert {"Sigmoid", "Exp", "Reshape", "Transpose"} <= ops_in_head
    assert not any(n.op_type == "Conv" and n.name.startswith("head/") for n in model.graph.node)


def test_size_two_stride_one_maxpool_pads_right_and_bottom_with_a_pad_op(tmp_path):
    net = write_tiny_net(tmp_path)
    model = build_darknet_model(net.cfg, net.weights, net.names)
    pads = {n.name: n for n in model.graph.node if n.op_type == "Pad"}
    assert list(pads) == ["L3/pad"]  # the stride-2 pool on an even size needs none
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert init["L3/pads"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_batch_norm_folding_equals_the_unfolded_computation():
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(5, 3, 3, 3))
    bias, gamma, mean = rng.normal(size=5), rng.uniform(0.5, 2, 5), rng.normal(size=5)
    var = rng.uniform(0.1, 3, 5)
    patches = rng.normal(size=(7, 3, 3, 3))  # seven receptive fields
    conv = np.einsum("fcyx,ncyx->nf", weight, patches)
    unfolded = gamma * (conv - mean) / np.sqrt(var + 1e-5) + bias
    folded_w, folded_b = fold_batch_norm(weight, bias, gamma, mean, var)
    np.testing.assert_allclose(np.einsum("fcyx,ncyx->nf", folded_w, patches) + folded_b, unfolded, rtol=1e-10)


@pytest.mark.parametrize(("major", "minor"), [(0, 2), (0, 1), (1, 0)])
def test_header_seen_is_int64_from_version_0_2_and_int32_before(tmp_path, major, minor):
    net = write_tiny_net(tmp_path, major=major, minor=minor)
    convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")


@pytest.mark.parametrize("extra", [1, -1, -100])
def test_a_weights_file_of_the_wrong_size_is_refused_naming_both_sizes(tmp_path, extra):
    net = write_tiny_net(tmp_path, extra_floats=extra)
    header = 20
    have, need = header + 4 * (parameter_count() + extra), header + 4 * parameter_count()
    with pytest.raises(ModelError, match=rf"tiny\.weights: file is {have} bytes but tiny\.cfg needs {need} "):
        convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")
    assert not (tmp_path / "tiny.onnx").exists()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda cfg: cfg.replace("[upsample]", "[crop]"), r"layer 10 \[crop\].*not supported"),
    (lambda cfg: cfg.replace("activation=leaky", "activation=mish", 1), r"layer 0 .*activation='mish'"),
    (lambda cfg: cfg.replace("layers = -4", "layers = 40"), r"layer 8 \[route\].*layer 40"),
    (lambda cfg: cfg.replace("mask = 0,1", "mask = 0,9"), r"layer 13 \[yolo\].*mask"),
    (lambda cfg: cfg.replace("classes=2", "classes=3", 1), r"layer 7 \[yolo\].*14 channels"),
    (lambda cfg: cfg.replace("filters=4", "filters=x", 1), r"layer 0 .*filters='x' is not an integer"),
    (lambda cfg: "[convolutional]\n" + cfg, r"first section must be \[net\]"),
])
def test_unsupported_or_malformed_cfgs_are_refused_naming_the_layer(tmp_path, edit, message):
    net = write_tiny_net(tmp_path)
    net.cfg.write_text(edit(TINY_CFG.format(height=32, width=32)))
    with pytest.raises(ModelError, match=message):
        convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")


def test_a_names_file_with_the_wrong_count_is_refused(tmp_path):
    net = write_tiny_net(tmp_path)
    net.names.write_text("cat\ndog\nbird\n")
    with pytest.raises(ModelError, match=r"tiny\.names: 3 class names, but .* 2 classes"):
        convert_darknet(net.cfg, net.weights, net.names, tmp_path / "tiny.onnx")


TINY_ANCHORS = "10,14,  23,27,  37,58,  81,82,  135,169,  344,319"


def _two_heads(first: str, second: str, anchors: str = TINY_ANCHORS) -> str:
    head = "[yolo]\nmask = {}\nanchors = {}\nclasses=80\nnum=6\n"
    return "[net]\nwidth=416\n\n" + head.format(first, anchors) + "\n" + head.format(second, anchors)


@pytest.mark.parametrize(("file_name", "cfg", "second_mask"), [
    ("yolov3-tiny.cfg", _two_heads("3,4,5", "0,1,2"), "1,2,3"),          # the packaged defect: fixed
    ("yolov3-tiny.cfg", _two_heads("3,4,5", "1,2,3"), "1,2,3"),          # upstream file: untouched
    ("my-tiny.cfg", _two_heads("3,4,5", "0,1,2"), "0,1,2"),              # another file: never rewritten
    ("yolov3-tiny.cfg", _two_heads("3,4,5", "0,1,2", "1,1,2,2,3,3,4,4,5,5,6,6"), "0,1,2"),  # custom anchors
])
def test_the_yolov3_tiny_mask_fixup_applies_only_to_the_known_defective_file(tmp_path, caplog, file_name, cfg,
                                                                             second_mask):
    path = tmp_path / file_name
    path.write_text(cfg)
    sections = parse_cfg(path)
    with caplog.at_level(logging.WARNING, logger="app.models.darknet.cfg"):
        applied = apply_known_fixups(path, sections)
    assert sections[2].options["mask"] == second_mask
    fixed = second_mask == "1,2,3" and "0,1,2" in cfg.split("[yolo]")[2]
    assert applied == (["yolov3-tiny-mask"] if fixed else [])
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == (1 if fixed else 0)
