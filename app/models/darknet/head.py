"""Decoding a darknet ``[yolo]`` head inside the ONNX graph, at whatever input size the model is run.

Darknet leaves the decode to its C code; doing it in the graph gives the
YOLOv5 export layout (one ``[batch, boxes, 5 + classes]`` tensor of pixels and
probabilities), so the same postprocess serves converted and exported models
and TensorRT fuses the elementwise work into the last kernels. For a cell
``(gx, gy)`` and anchor ``(aw, ah)`` in input pixels::

    cx = (sigmoid(tx) + gx) * stride_x      w = exp(tw) * aw
    cy = (sigmoid(ty) + gy) * stride_y      h = exp(th) * ah
    objectness, class_i = sigmoid(to), sigmoid(tc_i)

The grid comes from the feature map's runtime shape (``Shape`` → ``Gather`` →
``Range``), not from constants, so one file serves 416×416 and the
rectangular 416×320 or 416×192 inputs of a letterbox without grey bars. The
stride is the head's fixed downsampling factor (32, 16): exact, because the
converter only declares a dynamic input when every input size that is a
multiple of the network stride gives the same layer geometry. Only integer
shape ops (``Range`` on int64, then one ``Cast``) touch the runtime shape,
which TensorRT 10 resolves from the input's shape at build time.

Boxes are ordered anchor, row, column, like YOLOv5's ``view(bs, -1, no)``.
Every node and constant is named ``head/...`` so the quantizer can leave the
decode in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from onnx import TensorProto

HEAD_PREFIX = "head/"


class GraphSink(Protocol):
    """The part of the converter's graph builder the head needs."""

    def const(self, name: str, array: np.ndarray) -> str: ...

    def node(self, op: str, inputs: list[str], name: str, **attrs: object) -> str: ...


@dataclass(frozen=True, slots=True)
class YoloHead:
    """One ``[yolo]`` block: its input tensor, its grid at the cfg's input size and its anchors (input pixels)."""

    index: int
    source: str
    classes: int
    anchors: tuple[tuple[float, float], ...]
    grid_h: int
    grid_w: int
    stride_y: float
    stride_x: float

    @property
    def boxes(self) -> int:
        """Boxes at the cfg's input size (the count scales with the input area)."""
        return len(self.anchors) * self.grid_h * self.grid_w


def add_yolo_head(graph: GraphSink, head: YoloHead) -> str:
    """Append the decode of ``head`` to ``graph``; return the name of its ``[batch, boxes, 5+C]`` output."""
    p = f"{HEAD_PREFIX}L{head.index}/"
    a, no = len(head.anchors), 5 + head.classes
    shape4 = graph.const(p + "shape4", np.array([0, a, no, -1], np.int64))
    x = graph.node("Reshape", [head.source, shape4], p + "reshape")  # [N, A, 5+C, H*W]
    x = graph.node("Transpose", [x], p + "transpose", perm=[0, 1, 3, 2])  # [N, A, H*W, 5+C]
    xy = _slice_last(graph, x, 0, 2, p + "xy")
    wh = _slice_last(graph, x, 2, 4, p + "wh")
    rest = _slice_last(graph, x, 4, no, p + "scores")

    grid = _runtime_grid(graph, head.source, p + "grid")  # [1, 1, H*W, 2]: (gx, gy), row-major
    stride = graph.const(p + "stride", np.array([head.stride_x, head.stride_y], np.float32))
    anchors = graph.const(p + "anchors", np.array(head.anchors, np.float32).reshape(1, a, 1, 2))

    xy = graph.node("Sigmoid", [xy], p + "xy_sigmoid")
    xy = graph.node("Add", [xy, grid], p + "xy_grid")
    xy = graph.node("Mul", [xy, stride], p + "xy_pixels")
    wh = graph.node("Exp", [wh], p + "wh_exp")
    wh = graph.node("Mul", [wh, anchors], p + "wh_pixels")
    rest = graph.node("Sigmoid", [rest], p + "scores_sigmoid")
    x = graph.node("Concat", [xy, wh, rest], p + "concat", axis=-1)
    shape3 = graph.const(p + "shape3", np.array([0, -1, no], np.int64))
    return graph.node("Reshape", [x, shape3], p + "flatten")


def _runtime_grid(graph: GraphSink, feature: str, p: str) -> str:
    """``[1, 1, H*W, 2]`` float cell offsets ``(gx, gy)`` in row-major order, from ``feature``'s ``[N, C, H, W]``."""
    shape = graph.node("Shape", [feature], p + "/shape")
    size = graph.node("Gather", [shape, graph.const(p + "/hw_index", np.array([2, 3], np.int64))], p + "/hw")
    zero = graph.const(p + "/zero", np.array(0, np.int64))
    one = graph.const(p + "/one", np.array(1, np.int64))
    axes = {"rows": (2, 1), "cols": (3, 0)}  # shape index; the axis the 1-D range becomes a [H, 1] / [1, W] on
    coords = {}
    for name, (index, axis) in axes.items():
        count = graph.node("Gather", [shape, graph.const(f"{p}/{name}_index", np.array(index, np.int64))],
                           f"{p}/{name}")
        steps = graph.node("Range", [zero, count, one], f"{p}/{name}_range")  # int64: TensorRT-friendly
        steps = graph.node("Cast", [steps], f"{p}/{name}_float", to=TensorProto.FLOAT)
        steps = graph.node("Unsqueeze", [steps, graph.const(f"{p}/{name}_axis", np.array([axis], np.int64))],
                           f"{p}/{name}_2d")
        coords[name] = graph.node("Expand", [steps, size], f"{p}/{name}_hw")  # [H, W]
    last = graph.const(p + "/last_axis", np.array([-1], np.int64))
    gx = graph.node("Unsqueeze", [coords["cols"], last], p + "/gx")
    gy = graph.node("Unsqueeze", [coords["rows"], last], p + "/gy")
    grid = graph.node("Concat", [gx, gy], p + "/xy", axis=-1)  # [H, W, 2]
    return graph.node("Reshape", [grid, graph.const(p + "/shape4", np.array([1, 1, -1, 2], np.int64))], p)


def _slice_last(graph: GraphSink, x: str, start: int, end: int, name: str) -> str:
    starts = graph.const(name + "/starts", np.array([start], np.int64))
    ends = graph.const(name + "/ends", np.array([end], np.int64))
    axes = graph.const(name + "/axes", np.array([-1], np.int64))
    return graph.node("Slice", [x, starts, ends, axes], name)
