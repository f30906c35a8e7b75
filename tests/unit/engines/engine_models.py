"""Tiny ONNX models built with onnx.helper, and the numpy function they compute.

Every model maps input ``images`` ``(N, 3, H, W)`` float32 to two outputs:
``pooled`` ``(N, 3)`` = mean over H and W, times 2, plus 1; and ``scaled``
``(N, 3, H, W)`` = input times 0.5. :func:`reference` computes the same with
numpy, so engine results are checkable exactly (up to float rounding).
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


def make_model(path: Path, batch: int | None, *, height: int = HEIGHT, width: int = WIDTH) -> ModelSpec:
    """Write the model with a fixed (``batch``) or dynamic (None) batch dim; return its spec."""
    n: int | str = batch if batch is not None else "batch"
    x = helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [n, 3, height, width])
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [n, 3])
    scaled = helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [n, 3, height, width])
    nodes = [
        helper.make_node("ReduceMean", [INPUT], ["mean"], axes=[2, 3], keepdims=0),
        helper.make_node("Mul", ["mean", "two"], ["doubled"]),
        helper.make_node("Add", ["doubled", "one"], ["pooled"]),
        helper.make_node("Mul", [INPUT, "half"], ["scaled"]),
    ]
    inits = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [pooled, scaled], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return ModelSpec(
        name=path.stem, path=str(path), input_name=INPUT, input_height=height, input_width=width,
        layout="yolov8", class_names=("a", "b", "c"), static_batch=batch,
    )


def reference(frames: np.ndarray) -> list[np.ndarray]:
    """What the tiny model computes, with numpy."""
    frames = np.asarray(frames, np.float32)
    return [frames.mean(axis=(2, 3)) * 2 + 1, frames * 0.5]


def random_frames(count: int, seed: int = 0, *, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 3, height, width), dtype=np.float32)
