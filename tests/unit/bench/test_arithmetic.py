"""The FLOP count behind scripts/fp32_peak.py, checked by hand on a small graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.bench.arithmetic import conv_gflop, ort_ms_per_frame, ort_session


def _model(path: Path) -> Path:
    """conv 3→8 3×3 pad 1; conv 8→16 3×3 stride 2 pad 1; grouped conv 16→16 1×1 in 4 groups."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random(shape, np.float32), name) for name, shape in
             (("w1", (8, 3, 3, 3)), ("w2", (16, 8, 3, 3)), ("w3", (16, 4, 1, 1)))]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["c", "w3"], ["y"], group=4),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_conv_gflop_counts_every_conv_at_the_given_size(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    h, w = 32, 48
    expected = 2 * (8 * 3 * 9 * h * w            # conv 1: full resolution
                    + 16 * 8 * 9 * (h // 2) * (w // 2)  # conv 2: stride 2
                    + 16 * 4 * 1 * (h // 2) * (w // 2))  # conv 3: 4 groups of 4 input channels
    assert conv_gflop(model, h, w) == pytest.approx(expected / 1e9)
    assert conv_gflop(model, 2 * h, w) == pytest.approx(2 * expected / 1e9)  # linear in the pixels


def test_conv_gflop_of_the_default_model_matches_darknet(default_model: Path) -> None:
    # darknet prints 5.571 BFLOPs for yolov3-tiny at 416x416; this counts the convolutions only
    assert conv_gflop(default_model, 416, 416) == pytest.approx(5.57, abs=0.01)


def test_ort_ms_per_frame_is_thread_cpu_of_real_runs(tmp_path: Path) -> None:
    session = ort_session(_model(tmp_path / "m.onnx"))
    small = ort_ms_per_frame(session, "x", np.zeros((1, 3, 32, 32), np.float32), runs=20)
    large = ort_ms_per_frame(session, "x", np.zeros((1, 3, 256, 256), np.float32), runs=20)
    assert 0 < small < large  # 64x the pixels: the runs' own CPU, not a constant or the wall clock of an idle wait
