"""Decoding a darknet ``[yolo]`` head inside the ONNX graph.

Darknet leaves the decode to its C code; doing it in the graph gives the
YOLOv5 export layout (one ``[batch, boxes, 5 + classes]`` tensor of pixels and
probabilities), so the same postprocess serves converted and exported models
and TensorRT fuses the elementwise work into the last kernels. For a cell
``(gx, gy)`` and anchor ``(aw, ah)`` in input pixels::

    cx = (sigmoid(tx) + gx) * stride_x      w = exp(tw) * aw
    cy = (sigmoid(ty) + gy) * stride_y      h = exp(th) * ah
    objectness, class_i = sigmoid(to), sigmoid(tc_i)

Boxes are ordered anchor, row, column, like YOLOv5's ``view(bs, -1, no)``.
Every node and constant is named ``head/...`` so the quantizer can leave the
decode in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

HEAD_PREFIX = "head/"


class GraphSink(Protocol):
    """The part of the converter's graph builder the head needs."""

    def const(self, name: str, array: np.ndarray) -> str: ...

    def node(self, op: str, inputs: list[str], name: str, **attrs: object) -> str: ...


@dataclass(frozen=True, slots=True)
class YoloHead:
    """One ``[yolo]`` block: its input tensor, grid and the anchors (input pixels) its mask selects."""

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
        return len(self.anchors) * self.grid_h * self.grid_w


def add_yolo_head(graph: GraphSink, head: YoloHead) -> str:
    """Append the decode of ``head`` to ``graph``; return the name of its ``[batch, boxes, 5+C]`` output."""
    p = f"{HEAD_PREFIX}L{head.index}/"
    a, no, h, w = len(head.anchors), 5 + head.classes, head.grid_h, head.grid_w
    shape5 = graph.const(p + "shape5", np.array([0, a, no, h, w], np.int64))
    x = graph.node("Reshape", [head.source, shape5], p + "reshape")
    x = graph.node("Transpose", [x], p + "transpose", perm=[0, 1, 3, 4, 2])  # [N, A, H, W, 5+C]
    xy = _slice_last(graph, x, 0, 2, p + "xy")
    wh = _slice_last(graph, x, 2, 4, p + "wh")
    rest = _slice_last(graph, x, 4, no, p + "scores")

    gy, gx = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
    grid = graph.const(p + "grid", np.stack([gx, gy], axis=-1)[None, None])  # [1, 1, H, W, 2]
    stride = graph.const(p + "stride", np.array([head.stride_x, head.stride_y], np.float32))
    anchors = graph.const(p + "anchors", np.array(head.anchors, np.float32).reshape(1, a, 1, 1, 2))

    xy = graph.node("Sigmoid", [xy], p + "xy_sigmoid")
    xy = graph.node("Add", [xy, grid], p + "xy_grid")
    xy = graph.node("Mul", [xy, stride], p + "xy_pixels")
    wh = graph.node("Exp", [wh], p + "wh_exp")
    wh = graph.node("Mul", [wh, anchors], p + "wh_pixels")
    rest = graph.node("Sigmoid", [rest], p + "scores_sigmoid")
    x = graph.node("Concat", [xy, wh, rest], p + "concat", axis=-1)
    shape3 = graph.const(p + "shape3", np.array([0, head.boxes, no], np.int64))
    return graph.node("Reshape", [x, shape3], p + "flatten")


def _slice_last(graph: GraphSink, x: str, start: int, end: int, name: str) -> str:
    starts = graph.const(name + "/starts", np.array([start], np.int64))
    ends = graph.const(name + "/ends", np.array([end], np.int64))
    axes = graph.const(name + "/axes", np.array([-1], np.int64))
    return graph.node("Slice", [x, starts, ends, axes], name)
