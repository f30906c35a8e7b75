"""Reading a ModelSpec: one clear error per way a model file can be wrong, and layouts from shapes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.errors import ModelError
from app.models.coco import COCO80
from app.models.spec import load_model_spec
from app.postprocess.layouts import infer_layout


def write_model(path: Path, input_shape: list, output_shape: list, metadata: dict[str, str] | None = None,
                input_type: int = TensorProto.FLOAT, weights: int = 0) -> Path:
    """A graph that is only ever parsed, never run: input -> Identity -> output with the declared shapes."""
    inputs = [helper.make_tensor_value_info("images", input_type, input_shape)]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_shape)]
    inits = [numpy_helper.from_array(np.arange(weights, dtype=np.float32), "w")] if weights else []
    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["output"], name="id")], "g", inputs,
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, metadata or {})
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("shape", "layout"), [
    ([1, 2535, 85], "yolov5"),
    (["batch", 25200, 85], "yolov5"),
    ([1, 25200, 6], "yolov5"),             # one class: too many rows for an nms output
    (["batch", "boxes", 85], "yolov5"),
    ([1, 84, 8400], "yolov8"),
    (["batch", 84, "anchors"], "yolov8"),
    ([1, 5, 8400], "yolov8"),
    ([1, 300, 6], "nms"),
    (["batch", 100, 6], "nms"),
    ([1, 10], None),
    ([1, 2535, 85, 1], None),
    (["batch", "boxes", 6], None),         # nms or one-class yolov5: ambiguous, so not guessed
    ([1, 4, 4], None),
])
def test_layout_is_inferred_from_the_output_shape_only_when_unambiguous(shape, layout):
    assert infer_layout(shape) == layout


@pytest.mark.parametrize(("output_shape", "layout", "classes"), [
    (["batch", 2535, 85], "yolov5", 80),
    ([1, 84, 8400], "yolov8", 80),
    ([1, 300, 6], "nms", 80),
    ([1, 6300, 7], "yolov5", 2),
])
def test_a_model_without_metadata_gets_its_layout_from_the_shape(tmp_path, output_shape, layout, classes):
    spec = load_model_spec(write_model(tmp_path / "m.onnx", [1, 3, 640, 640], output_shape))
    assert spec.layout == layout
    assert len(spec.class_names) == classes
    assert spec.class_names == (COCO80 if classes == 80 else ("class0", "class1"))


def test_a_converted_model_reads_everything_from_its_metadata(tmp_path):
    path = write_model(tmp_path / "tiny.onnx", ["batch", 3, "h", "w"], ["batch", 2535, 7], {
        "detstream.layout": "yolov5", "detstream.input_size": "416x320",
        "detstream.class_names": json.dumps(["cat", "dog"]), "detstream.scale": "0.5"})
    spec = load_model_spec(path, name="custom")
    assert (spec.name, spec.layout, spec.class_names) == ("custom", "yolov5", ("cat", "dog"))
    assert (spec.input_height, spec.input_width, spec.scale, spec.static_batch) == (416, 320, 0.5, None)
    assert spec.input_name == "images"
    assert spec.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_ultralytics_metadata_names_and_imgsz_are_understood(tmp_path):
    names = {i: f"thing{i}" for i in range(3)}
    meta = {"names": repr(names), "imgsz": "[320, 256]"}
    path = write_model(tmp_path / "u.onnx", [2, 3, "h", "w"], [2, 7, 8400], meta)
    spec = load_model_spec(path)
    assert spec.class_names == ("thing0", "thing1", "thing2")
    assert (spec.input_height, spec.input_width, spec.static_batch) == (320, 256, 2)


def test_a_names_file_overrides_the_metadata_and_must_match_the_class_count(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 64, 64], [1, 100, 7],
                       {"detstream.class_names": json.dumps(["a", "b"])})
    (tmp_path / "good.names").write_text("x\ny\n\n")
    (tmp_path / "bad.names").write_text("x\ny\nz\n")
    assert load_model_spec(path, names_file=str(tmp_path / "good.names")).class_names == ("x", "y")
    with pytest.raises(ModelError, match=r"m\.onnx: the output has 2 classes but model\.names_file .*bad\.names "
                                         r"gives 3 class names"):
        load_model_spec(path, names_file=str(tmp_path / "bad.names"))


def _jpeg(path: Path) -> Path:
    _, data = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    path.write_bytes(data.tobytes())
    return path


def _truncated(path: Path) -> Path:
    full = write_model(path.with_name("full.onnx"), [1, 3, 64, 64], [1, 100, 85], weights=20000)
    path.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    return path


BAD_FILES = [
    ("missing", lambda p: p, r"no such model file"),
    ("directory", lambda p: (p.mkdir(), p)[1], r"is a directory"),
    ("empty", lambda p: (p.write_bytes(b""), p)[1], r"not an ONNX model \(the file is empty\)"),
    ("text", lambda p: (p.write_text("name: yolov8n\nnot a model\n"), p)[1], r"not an ONNX model .*text file"),
    ("jpeg", _jpeg, r"not an ONNX model .*JPEG image"),
    ("truncated", _truncated, r"not an ONNX model .*(truncated|does not parse)"),
    ("rank3", lambda p: write_model(p, [1, 3, 416], [1, 100, 85]),
     r"input 'images' has shape \[1, 3, 416\]; expected \[N, 3, H, W\]"),
    ("gray", lambda p: write_model(p, [1, 1, 416, 416], [1, 100, 85]),
     r"input 'images' has shape \[1, 1, 416, 416\]; expected \[N, 3, H, W\]"),
    ("uint8", lambda p: write_model(p, [1, 3, 416, 416], [1, 100, 85], input_type=TensorProto.UINT8),
     r"input 'images' is uint8; detstream feeds float32"),
    ("nolayout", lambda p: write_model(p, [1, 3, 416, 416], [1, 10]),
     r"output shape \[1, 10\] matches no known layout"),
    ("mismatch", lambda p: write_model(p, [1, 3, 416, 416], [1, 2535, 85], {"detstream.layout": "yolov8"}),
     r"layout yolov8 \(from metadata\) does not fit output shape \[1, 2535, 85\] .*looks like yolov5"),
    ("badlayout", lambda p: write_model(p, [1, 3, 416, 416], [1, 2535, 85], {"detstream.layout": "ssd"}),
     r"metadata detstream.layout is 'ssd', not a known layout"),
    ("badnames", lambda p: write_model(p, [1, 3, 416, 416], [1, 2535, 85], {"detstream.class_names": "[1,"}),
     r"malformed class names in metadata"),
]


@pytest.mark.parametrize(("case", "make", "problem"), BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_a_bad_model_file_is_one_modelerror_line_naming_the_path_and_the_problem(tmp_path, case, make, problem):
    path = make(tmp_path / f"{case}.onnx")
    with pytest.raises(ModelError) as caught:
        load_model_spec(path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / case}.onnx: "), message
    assert "\n" not in message
    assert re.search(problem, message), message


def test_model_format_that_contradicts_the_metadata_names_both(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 416, 416], [1, 2535, 85], {"detstream.layout": "yolov5"})
    with pytest.raises(ModelError, match=r"m\.onnx: model\.format says yolov8 but the file's metadata says yolov5"):
        load_model_spec(path, layout_override="yolov8")


def test_model_format_that_the_output_shape_cannot_hold_names_both(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 416, 416], [1, 300, 7])
    with pytest.raises(ModelError, match=r"layout nms \(from model\.format\) does not fit output shape \[1, 300, 7\]"):
        load_model_spec(path, layout_override="nms")
    assert load_model_spec(path, layout_override="yolov5").layout == "yolov5"


def test_model_format_is_trusted_on_any_shape_that_can_hold_it(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 640, 640], [1, 84, 50])  # yolov8 head with only 50 boxes
    spec = load_model_spec(path, layout_override="yolov8")
    assert (spec.layout, spec.class_names) == ("yolov8", COCO80)


def test_a_shape_several_layouts_could_hold_asks_for_model_format(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 640, 640], ["batch", "boxes", 6])  # nms, or 1-class yolov5
    with pytest.raises(ModelError, match=r"m\.onnx: output shape \[batch, boxes, 6\] is ambiguous \(it could be "
                                         r"yolov5 .* or nms .*\); set model\.format to say which"):
        load_model_spec(path)
    assert load_model_spec(path, layout_override="nms").layout == "nms"


def test_metadata_naming_a_layout_the_shape_lies_against_is_refused(tmp_path):
    path = write_model(tmp_path / "m.onnx", [1, 3, 640, 640], [1, 84, 50], {"detstream.layout": "yolov8"})
    with pytest.raises(ModelError, match=r"layout yolov8 \(from metadata\) does not fit output shape \[1, 84, 50\]"):
        load_model_spec(path)


@pytest.mark.parametrize(("input_shape", "metadata", "dynamic_hw", "stride"), [
    (["batch", 3, "height", "width"], {"detstream.stride": "32"}, True, 32),   # our converter, v2
    (["batch", 3, "height", "width"], {"detstream.stride": "64"}, True, 64),
    ([1, 3, "h", "w"], {"stride": "32", "imgsz": "[640, 640]"}, True, 32),      # Ultralytics dynamic=True
    ([1, 3, "h", "w"], {"stride": "[8, 16, 32]"}, True, 32),                     # per-head strides: the largest
    ([1, 3, None, None], {}, True, 32),                                         # absent dims, no metadata
    (["batch", 3, 416, 416], {"detstream.stride": "32"}, False, 32),           # converter v1 / a static export
    ([1, 3, 640, "w"], {}, False, 32),                                          # one fixed side is not dynamic
])
def test_dynamic_hw_means_both_sides_symbolic_and_stride_comes_from_the_metadata(tmp_path, input_shape, metadata,
                                                                                dynamic_hw, stride):
    metadata = {"detstream.input_size": "416x416", **metadata}
    spec = load_model_spec(write_model(tmp_path / "m.onnx", input_shape, ["batch", "boxes", 85], metadata))
    assert (spec.dynamic_hw, spec.stride) == (dynamic_hw, stride)


@pytest.mark.parametrize("stride", ["0", "-32", "thirty-two", "[]"])
def test_a_malformed_stride_in_the_metadata_is_one_line_naming_it(tmp_path, stride):
    path = write_model(tmp_path / "m.onnx", [1, 3, "h", "w"], [1, "boxes", 85], {"detstream.stride": stride})
    with pytest.raises(ModelError, match=rf"m\.onnx: metadata detstream\.stride='{re.escape(stride)}' is not a "):
        load_model_spec(path)
