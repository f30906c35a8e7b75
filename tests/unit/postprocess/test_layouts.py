"""The layout registry, and a new layout added the documented way: one module plus one registration."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.config import ModelConfig
from app.errors import ModelError
from app.models.spec import load_model_spec
from app.postprocess.layouts import LAYOUTS, infer_layout, register
from app.postprocess.yolo import decode_batch
from app.types import Letterbox
from tests.conftest import ROOT

NAMES = ("cat", "dog", "bird")
# the example model's 64x64 input letterboxes a 128x128 frame: frame px = input px * 2
FRAME = Letterbox(scale=0.5, pad_x=0.0, pad_y=0.0, src_width=128, src_height=128)
ROWS = [  # x1, y1, x2, y2 (input px), then one score per class
    [10, 10, 30, 20, 0.1, 0.9, 0.2],  # dog 0.9 -> frame (20, 20, 60, 40)
    [11, 10, 31, 20, 0.0, 0.8, 0.0],  # dog 0.8, IoU 0.9 with the first: suppressed
    [40, 40, 60, 60, 0.7, 0.0, 0.0],  # cat 0.7 -> frame (80, 80, 120, 120)
    [5, 5, 9, 9, 0.1, 0.1, 0.2],      # best score 0.2 <= 0.25: dropped
]


def documented_layout_module() -> str:
    """The first python block of docs/models.md's "Adding an output layout": the module a reader would write."""
    doc = (ROOT / "docs" / "models.md").read_text()
    section = doc.split("## Adding an output layout\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def xyxy_scores(tmp_path, monkeypatch):
    """The documented module, written to a package of its own and registered with one call."""
    package = tmp_path / "my_layouts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "xyxy_scores.py").write_text(documented_layout_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_layouts.xyxy_scores")
    register(module.LAYOUT)  # the one registration
    yield module.LAYOUT
    del LAYOUTS[module.LAYOUT.name]
    sys.modules.pop("my_layouts.xyxy_scores", None)
    sys.modules.pop("my_layouts", None)


def write_constant_model(path: Path, value: np.ndarray) -> Path:
    """A 64x64 detector whose output is always ``value`` (and that reads its input, as a detector would)."""
    zero = helper.make_node("ReduceSum", ["images"], ["total"], keepdims=0)
    scale = helper.make_node("Mul", ["total", "zero"], ["nothing"])
    out = helper.make_node("Add", ["rows", "nothing"], ["output"])
    graph = helper.make_graph(
        [zero, scale, out], "constant",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(value.shape))],
        [numpy_helper.from_array(value.astype(np.float32), "rows"), numpy_helper.from_array(np.float32(0), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"detstream.class_names": '["cat", "dog", "bird"]'})
    onnx.save(model, str(path))
    return path


def test_the_builtin_layouts_are_registered_in_order():
    assert list(LAYOUTS) == ["yolov5", "yolov8", "nms"]
    assert all(name == layout.name for name, layout in LAYOUTS.items())


def test_a_name_already_taken_is_refused():
    class Impostor(type(LAYOUTS["nms"])):
        pass

    with pytest.raises(ValueError, match="'nms' is already registered"):
        register(Impostor())
    assert register(LAYOUTS["nms"]) is LAYOUTS["nms"]  # registering the same layout again is harmless


def test_a_documented_new_layout_is_specced_and_decoded_end_to_end(tmp_path, xyxy_scores):
    padded = np.zeros((1, 100, 7), np.float32)
    padded[0, : len(ROWS)] = ROWS
    path = write_constant_model(tmp_path / "m.onnx", padded)

    assert ModelConfig(path=str(path), format="xyxy_scores").format == "xyxy_scores"
    assert infer_layout([1, 100, 7]) == "yolov5"  # a layout that claims no shape leaves inference alone
    spec = load_model_spec(path, layout_override=ModelConfig(format="xyxy_scores").format)
    assert (spec.layout, spec.class_names, spec.input_height) == ("xyxy_scores", NAMES, 64)

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"images": np.zeros((1, 3, 64, 64), np.float32)})
    (dets,) = decode_batch(outputs, spec, [FRAME], conf_threshold=0.25, iou_threshold=0.45,
                           class_ids_keep=None, max_detections=100)
    np.testing.assert_allclose(dets.xyxy, [[20, 20, 60, 40], [80, 80, 120, 120]], atol=1e-4)
    np.testing.assert_allclose(dets.scores, [0.9, 0.7], atol=1e-6)
    np.testing.assert_array_equal(dets.class_ids, [1, 0])


def test_the_new_layout_checks_its_class_count_like_a_builtin_one(tmp_path, xyxy_scores):
    path = write_constant_model(tmp_path / "m.onnx", np.zeros((1, 100, 9), np.float32))
    with pytest.raises(ModelError, match=r"the output has 5 classes but the file's metadata gives 3 class names"):
        load_model_spec(path, layout_override="xyxy_scores")


def test_an_unregistered_layout_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"unknown output layout 'xyxy_scores' \(registered: yolov5, yolov8, nms\)"):
        ModelConfig(format="xyxy_scores")
