"""Tiny ONNX models built with onnx.helper, and the numpy function they compute.

Every model maps input ``images`` ``(N, 3, H, W)`` float32 to two outputs:
``pooled`` ``(N, 3)`` = mean over H and W, times 2, plus 1; and ``scaled``
``(N, 3, H, W)`` = input times 0.5. :func:`reference` computes the same with
numpy, so engine results are checkable exactly (up to float rounding).

``dynamic_hw=True`` makes H and W symbolic (the spec then says
``dynamic_hw``, stride 4); ``fragile=True`` adds a ``Range`` whose step is 0
when any input value of a run is ``>= FAIL_AT``, so ONNX Runtime fails that
run at execution time ("delta ... can not be zero") and every other run
computes the usual outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from app.types import ModelSpec

INPUT = "images"
HEIGHT = 8
WIDTH = 8
STRIDE = 4
FAIL_AT = 100.0


def make_model(path: Path, batch: int | None, *, height: int = HEIGHT, width: int = WIDTH,
               dynamic_hw: bool = False, fragile: bool = False, fail_at: float = FAIL_AT) -> ModelSpec:
    """Write the model with a fixed (``batch``) or dynamic (None) batch dim; return its spec.

    ``fail_at`` moves the fragile model's threshold (0.0: every run fails, zeros included).
    """
    n: int | str = batch if batch is not None else "batch"
    h: int | str = "height" if dynamic_hw else height
    w: int | str = "width" if dynamic_hw else width
    x = helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [n, 3, h, w])
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [n, 3])
    scaled = helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [n, 3, h, w])
    nodes = [
        helper.make_node("ReduceMean", [INPUT], ["mean"], axes=[2, 3], keepdims=0),
        helper.make_node("Mul", ["mean", "two"], ["doubled"]),
        helper.make_node("Add", ["doubled", "one"], ["pooled" if not fragile else "pooled_ok"]),
        helper.make_node("Mul", [INPUT, "half"], ["scaled"]),
    ]
    inits = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
    ]
    if fragile:
        nodes += [  # step = (max(x) < FAIL_AT); Range(0, 1, 0) fails; the sum of Range(0, 1, 1) times 0 is added
            helper.make_node("ReduceMax", [INPUT], ["peak"], keepdims=0),
            helper.make_node("Less", ["peak", "fail_at"], ["sane"]),
            helper.make_node("Cast", ["sane"], ["step"], to=TensorProto.INT64),
            helper.make_node("Range", ["zero_i", "one_i", "step"], ["steps"]),
            helper.make_node("ReduceSum", ["steps"], ["count"], keepdims=0),
            helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["count_f", "nought"], ["nothing"]),
            helper.make_node("Add", ["pooled_ok", "nothing"], ["pooled"]),
        ]
        inits += [
            helper.make_tensor("fail_at", TensorProto.FLOAT, [], [fail_at]),
            helper.make_tensor("zero_i", TensorProto.INT64, [], [0]),
            helper.make_tensor("one_i", TensorProto.INT64, [], [1]),
            helper.make_tensor("nought", TensorProto.FLOAT, [], [0.0]),
        ]
    graph = helper.make_graph(nodes, "tiny", [x], [pooled, scaled], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return ModelSpec(
        name=path.stem, path=str(path), input_name=INPUT, input_height=height, input_width=width,
        layout="yolov8", class_names=("a", "b", "c"), static_batch=batch, dynamic_hw=dynamic_hw, stride=STRIDE,
    )


def reference(frames: np.ndarray) -> list[np.ndarray]:
    """What the tiny model computes, with numpy."""
    frames = np.asarray(frames, np.float32)
    return [frames.mean(axis=(2, 3)) * 2 + 1, frames * 0.5]


def random_frames(count: int, seed: int = 0, *, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 3, height, width), dtype=np.float32)
