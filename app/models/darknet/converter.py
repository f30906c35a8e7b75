"""Darknet (``.cfg`` + ``.weights``) → ONNX, with numpy and onnx only.

Supported blocks: ``[convolutional]`` (optional ``batch_normalize``, folded into
the conv; ``activation`` leaky or linear; ``groups``), ``[maxpool]`` (darknet's
implicit right/bottom padding, e.g. size=2 stride=1, is an explicit edge ``Pad``),
``[upsample]`` (nearest ``Resize``), ``[route]`` (one or several ``layers``,
relative or absolute; ``Concat``), ``[shortcut]`` (``Add``) and ``[yolo]``.

The ``[yolo]`` heads are decoded inside the graph (see :mod:`app.models.darknet.head`)
so the model has one output ``output`` ``[batch, boxes, 5 + classes]``, the
YOLOv5 export layout the postprocess stage already reads. Backbone nodes are
named ``L<layer>/<op>``, decode nodes ``head/...``, which is what
:mod:`app.models.quantization.quantize` keys on to keep the decode in fp32.

Input height and width are symbolic (``["batch", 3, "height", "width"]``) so a
letterbox can feed 416×320 instead of 416×416 and skip the grey bars: every
multiple of the network stride (the lcm of the layers' downsampling factors,
32 for yolov3-tiny) gives the same layer geometry as the cfg's own size, so
the same pads and concatenations hold. That is checked, not assumed: a cfg
whose size is not divided exactly at every layer keeps a fixed input, as
converter version 1 wrote every model. ``detstream.input_size`` stays the
cfg's size (the largest the pipeline feeds) and ``detstream.stride`` says what
the sides must be multiples of.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.errors import ModelError
from app.models.darknet.cfg import DarknetWeights, Section, apply_known_fixups, parse_cfg, read_weights
from app.models.darknet.head import YoloHead, add_yolo_head
from app.models.store.files import atomic_write_bytes

logger = logging.getLogger(__name__)

CONVERTER_VERSION = "2"  # 2: dynamic input height/width, runtime grid, detstream.stride
OPSET = 17
BN_EPS = 1e-5  # darknet's GPU kernel: x_hat = (x - mean) / sqrt(var + .00001)
LEAKY_SLOPE = 0.1
INPUT_NAME = "images"
OUTPUT_NAME = "output"


@dataclass(slots=True)
class _Tensor:
    """A layer output: its graph name, (channels, height, width) at the cfg's input size, and ``stride``,
    how many input pixels one of its cells spans (a fraction only after more upsampling than downsampling)."""

    name: str
    channels: int
    height: int
    width: int
    stride: Fraction = Fraction(1)


class _WeightCursor:
    """Hands out consecutive float32 runs; records how many the cfg asked for even past the end."""

    def __init__(self, weights: DarknetWeights) -> None:
        self._values = weights.values
        self.needed = 0

    def take(self, count: int) -> np.ndarray:
        start, self.needed = self.needed, self.needed + count
        chunk = self._values[start:self.needed]
        if chunk.size < count:  # short file: keep building so the error can give the exact total
            return np.zeros(count, np.float32)
        return chunk


class _Graph:
    """Accumulates nodes and initializers; every name is unique by construction."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name


def _conv(graph: _Graph, sec: Section, x: _Tensor, cursor: _WeightCursor) -> _Tensor:
    filters = sec.get_int("filters")
    size = sec.get_int("size", 1)
    stride = sec.get_int("stride", 1)
    groups = sec.get_int("groups", 1)
    pad = size // 2 if sec.get_int("pad", 0) else sec.get_int("padding", 0)
    activation = sec.get_str("activation", "logistic")
    if activation not in ("leaky", "linear"):
        raise ModelError(f"{sec.where()}: activation={activation!r} is not supported (leaky, linear)")
    if x.channels % groups or filters % groups:
        raise ModelError(f"{sec.where()}: groups={groups} does not divide {x.channels} inputs and {filters} filters")
    if sec.get_int("batch_normalize", 0):
        bias, gamma = cursor.take(filters), cursor.take(filters)
        mean, var = cursor.take(filters), cursor.take(filters)
    else:
        bias = cursor.take(filters)
    weight = cursor.take(filters * (x.channels // groups) * size * size).reshape(
        filters, x.channels // groups, size, size)
    if sec.get_int("batch_normalize", 0):
        weight, bias = fold_batch_norm(weight, bias, gamma, mean, var)
    prefix = f"L{sec.index}"
    w = graph.const(f"{prefix}/W", weight.astype(np.float32))
    b = graph.const(f"{prefix}/B", bias.astype(np.float32))
    out = graph.node("Conv", [x.name, w, b], f"{prefix}/conv", kernel_shape=[size, size], strides=[stride, stride],
                     pads=[pad] * 4, group=groups)
    if activation == "leaky":
        out = graph.node("LeakyRelu", [out], f"{prefix}/leaky", alpha=LEAKY_SLOPE)
    height = (x.height + 2 * pad - size) // stride + 1
    width = (x.width + 2 * pad - size) // stride + 1
    return _Tensor(out, filters, height, width, x.stride * stride)


def fold_batch_norm(weight: np.ndarray, bias: np.ndarray, gamma: np.ndarray, mean: np.ndarray,
                    var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Conv weights and bias that compute ``gamma * (conv(x) - mean) / sqrt(var + eps) + bias`` in one conv.

    Folding removes a whole op per layer at inference and is exact up to
    float rounding; ``bias`` is darknet's BN shift (its conv has no own bias).
    """
    factor = gamma / np.sqrt(var + BN_EPS)
    return weight * factor[:, None, None, None], bias - mean * factor


def _maxpool(graph: _Graph, sec: Section, x: _Tensor) -> _Tensor:
    size = sec.get_int("size", 1)
    stride = sec.get_int("stride", 1)
    padding = sec.get_int("padding", size - 1)
    height = (x.height + padding - size) // stride + 1
    width = (x.width + padding - size) // stride + 1
    top, left = padding // 2, padding // 2
    bottom = (height - 1) * stride + size - x.height - top
    right = (width - 1) * stride + size - x.width - left
    prefix, source = f"L{sec.index}", x.name
    if max(top, left, bottom, right) > 0:
        # Darknet skips out-of-image cells; repeating the edge is the same for a max as long as
        # every padded window also holds the edge cell, which pads < size guarantees.
        if max(top, left, bottom, right) >= size:
            raise ModelError(f"{sec.where()}: padding={padding} is not supported for size={size}")
        pads = graph.const(f"{prefix}/pads", np.array([0, 0, top, left, 0, 0, bottom, right], np.int64))
        source = graph.node("Pad", [source, pads], f"{prefix}/pad", mode="edge")
    out = graph.node("MaxPool", [source], f"{prefix}/maxpool", kernel_shape=[size, size], strides=[stride, stride])
    return _Tensor(out, x.channels, height, width, x.stride * stride)


def _upsample(graph: _Graph, sec: Section, x: _Tensor) -> _Tensor:
    stride = sec.get_int("stride", 2)
    if sec.get_float("scale", 1.0) != 1.0 or stride < 1:
        raise ModelError(f"{sec.where()}: only upsample with a positive stride and scale=1 is supported")
    prefix = f"L{sec.index}"
    scales = graph.const(f"{prefix}/scales", np.array([1, 1, stride, stride], np.float32))
    out = graph.node("Resize", [x.name, "", scales], f"{prefix}/resize", mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return _Tensor(out, x.channels, x.height * stride, x.width * stride, x.stride / stride)


def _layer_ref(sec: Section, ref: int, outputs: list[_Tensor]) -> _Tensor:
    index = sec.index + ref if ref < 0 else ref
    if not 0 <= index < len(outputs):
        raise ModelError(f"{sec.where()}: refers to layer {ref} (absolute {index}), which does not exist before it")
    return outputs[index]


def _route(graph: _Graph, sec: Section, outputs: list[_Tensor]) -> _Tensor:
    if sec.get_int("groups", 1) != 1:
        raise ModelError(f"{sec.where()}: route with groups is not supported")
    parts = [_layer_ref(sec, ref, outputs) for ref in sec.get_ints("layers")]
    if not parts:
        raise ModelError(f"{sec.where()}: layers= is empty")
    if len(parts) == 1:
        return parts[0]
    if len({(p.height, p.width) for p in parts}) != 1:
        sizes = ", ".join(f"{p.height}x{p.width}" for p in parts)
        raise ModelError(f"{sec.where()}: cannot concatenate layers of different sizes ({sizes})")
    out = graph.node("Concat", [p.name for p in parts], f"L{sec.index}/concat", axis=1)
    stride = parts[0].stride if len({p.stride for p in parts}) == 1 else Fraction(0)  # 0: mixed, never exact
    return _Tensor(out, sum(p.channels for p in parts), parts[0].height, parts[0].width, stride)


def _shortcut(graph: _Graph, sec: Section, x: _Tensor, outputs: list[_Tensor]) -> _Tensor:
    refs = sec.get_ints("from")
    if len(refs) != 1:
        raise ModelError(f"{sec.where()}: shortcut from several layers is not supported")
    other = _layer_ref(sec, refs[0], outputs)
    if (other.channels, other.height, other.width) != (x.channels, x.height, x.width):
        raise ModelError(f"{sec.where()}: shortcut of different shapes is not supported")
    activation = sec.get_str("activation", "linear")
    if activation not in ("leaky", "linear"):
        raise ModelError(f"{sec.where()}: activation={activation!r} is not supported (leaky, linear)")
    out = graph.node("Add", [x.name, other.name], f"L{sec.index}/add")
    if activation == "leaky":
        out = graph.node("LeakyRelu", [out], f"L{sec.index}/leaky", alpha=LEAKY_SLOPE)
    return _Tensor(out, x.channels, x.height, x.width, x.stride if x.stride == other.stride else Fraction(0))


def _yolo(sec: Section, x: _Tensor, net_h: int, net_w: int) -> YoloHead:
    classes = sec.get_int("classes", 20)
    anchors = sec.get_floats("anchors")
    num = sec.get_int("num", len(anchors) // 2)
    mask = sec.get_ints("mask", tuple(range(num)))
    if len(anchors) != 2 * num or any(not 0 <= m < num for m in mask):
        raise ModelError(f"{sec.where()}: mask {list(mask)} / anchors do not match num={num}")
    if sec.get_float("scale_x_y", 1.0) != 1.0 or sec.get_int("new_coords", 0):
        raise ModelError(f"{sec.where()}: scale_x_y / new_coords heads are not supported")
    if x.channels != len(mask) * (5 + classes):
        raise ModelError(f"{sec.where()}: input has {x.channels} channels, "
                         f"expected {len(mask)} anchors x (5 + {classes} classes) = {len(mask) * (5 + classes)}")
    chosen = tuple((anchors[2 * m], anchors[2 * m + 1]) for m in mask)
    return YoloHead(sec.index, x.name, classes, chosen, x.height, x.width, net_h / x.height, net_w / x.width)


@dataclass(slots=True)
class _Network:
    """The built graph, its heads, the cfg's input size and the network stride (None: fixed input only)."""

    graph: _Graph
    heads: list[YoloHead]
    height: int
    width: int
    stride: int | None


def network_stride(tensors: list[_Tensor], net_h: int, net_w: int) -> int | None:
    """The stride the input sides must be multiples of, or None when the cfg's geometry only holds at its own size.

    When every layer's size is exactly the input size divided by its
    (integer) stride, each conv and pool sees a multiple of its own stride at
    any input that is a multiple of the lcm of all strides, and its output
    size and edge pads are then the same function of the input as at the
    cfg's size. Anything else (a pool that drops a row, an odd size, a concat
    of two strides) keeps the input fixed.
    """
    for t in tensors:
        if t.stride.denominator != 1 or t.stride < 1 or t.height * t.stride != net_h or t.width * t.stride != net_w:
            return None
    return lcm(*(int(t.stride) for t in tensors))


def _build(sections: list[Section], cursor: _WeightCursor) -> _Network:
    net = sections[0]
    net_h, net_w, channels = net.get_int("height", 416), net.get_int("width", 416), net.get_int("channels", 3)
    graph = _Graph()
    x = _Tensor(INPUT_NAME, channels, net_h, net_w)
    outputs: list[_Tensor] = []
    heads: list[YoloHead] = []
    for sec in sections[1:]:
        if sec.kind in ("convolutional", "conv"):
            x = _conv(graph, sec, x, cursor)
        elif sec.kind in ("maxpool", "max"):
            x = _maxpool(graph, sec, x)
        elif sec.kind == "upsample":
            x = _upsample(graph, sec, x)
        elif sec.kind == "route":
            x = _route(graph, sec, outputs)
        elif sec.kind == "shortcut":
            x = _shortcut(graph, sec, x, outputs)
        elif sec.kind == "yolo":
            heads.append(_yolo(sec, x, net_h, net_w))
        else:
            raise ModelError(f"{sec.where()}: block type is not supported "
                             "(convolutional, maxpool, upsample, route, shortcut, yolo)")
        outputs.append(x)
    if not heads:
        raise ModelError(f"{sections[0].source}: the cfg has no [yolo] block, nothing to output")
    stride = network_stride([_Tensor(INPUT_NAME, channels, net_h, net_w), *outputs], net_h, net_w)
    return _Network(graph, heads, net_h, net_w, stride)


def _read_names(path: Path, classes: int) -> list[str]:
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(f"{path}: cannot read class names ({error})") from None
    if len(names) != classes:
        raise ModelError(f"{path}: {len(names)} class names, but the cfg's [yolo] heads have {classes} classes")
    return names


def build_darknet_model(cfg_path: Path, weights_path: Path, names_path: Path,
                        fix_known_defects: bool = True) -> onnx.ModelProto:
    """The converted, checked ONNX model in memory (see :func:`convert_darknet`)."""
    sections = parse_cfg(cfg_path)
    fixups = apply_known_fixups(cfg_path, sections) if fix_known_defects else []
    weights = read_weights(weights_path)
    cursor = _WeightCursor(weights)
    network = _build(sections, cursor)
    graph, heads, net_h, net_w = network.graph, network.heads, network.height, network.width
    if cursor.needed != weights.values.size:
        needed_bytes = weights.header_bytes + 4 * cursor.needed
        raise ModelError(f"{weights_path}: file is {weights.file_bytes} bytes but {cfg_path.name} needs "
                         f"{needed_bytes} ({weights.header_bytes}-byte header + {cursor.needed} float32 parameters)")
    classes = {h.classes for h in heads}
    if len(classes) != 1:
        raise ModelError(f"{cfg_path}: [yolo] heads disagree on classes ({sorted(classes)})")
    names = _read_names(names_path, classes.pop())
    parts = [add_yolo_head(graph, head) for head in heads]
    if len(parts) > 1:
        graph.node("Concat", parts, OUTPUT_NAME, axis=1)
    else:
        graph.node("Identity", parts, OUTPUT_NAME)
    if network.stride is None:
        logger.info("%s: layer sizes at %dx%d do not scale with the input; the model keeps a fixed input size",
                    cfg_path, net_h, net_w)
        hw: list[str | int] = [net_h, net_w]
        boxes: str | int = sum(h.boxes for h in heads)
    else:
        hw, boxes = ["height", "width"], "boxes"
    inputs = [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", 3, *hw])]
    outputs = [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", boxes, 5 + len(names)])]
    graph_proto = helper.make_graph(graph.nodes, cfg_path.stem, inputs, outputs, graph.initializers)
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="detstream.darknet", producer_version=CONVERTER_VERSION)
    model.ir_version = 8  # readable by every onnxruntime >= 1.14 and TensorRT 8.6
    metadata = {
        "detstream.layout": "yolov5",
        "detstream.input_size": f"{net_h}x{net_w}",
        "detstream.class_names": json.dumps(names),
        "detstream.source": f"darknet:{cfg_path.name}",
        "detstream.scale": repr(1.0 / 255.0),
        "detstream.converter_version": CONVERTER_VERSION,
    }
    if network.stride is not None:
        metadata["detstream.stride"] = str(network.stride)
    if fixups:
        metadata["detstream.fixups"] = ",".join(fixups)
    onnx.helper.set_model_props(model, metadata)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as error:
        raise ModelError(f"{cfg_path}: converted graph failed the ONNX checker: {str(error).splitlines()[0]}") from None
    return model


def convert_darknet(cfg_path: Path, weights_path: Path, names_path: Path, out_path: Path,
                    fix_known_defects: bool = True) -> Path:
    """Convert a darknet YOLO model to ONNX at ``out_path`` (written to a temp file, then renamed).

    The output has input ``images`` ``[batch, 3, height, width]`` (RGB, /255;
    any multiple of ``detstream.stride``, or the cfg's size only when the cfg's
    geometry does not scale, see :func:`network_stride`) and output
    ``output`` ``[batch, boxes, 5 + classes]``: cx, cy, w, h in input pixels,
    objectness and per-class probabilities, all already sigmoid/exp decoded.
    ``fix_known_defects`` applies the documented cfg fix-ups of
    :func:`app.models.darknet.cfg.apply_known_fixups` (logged at WARNING).
    Raises :class:`ModelError` for unsupported blocks and for a weights file
    whose size does not match what the cfg consumes.
    """
    cfg_path, weights_path, names_path, out_path = map(Path, (cfg_path, weights_path, names_path, out_path))
    model = build_darknet_model(cfg_path, weights_path, names_path, fix_known_defects)
    atomic_write_bytes(out_path, model.SerializeToString())
    logger.info("converted %s + %s -> %s", cfg_path.name, weights_path.name, out_path)
    return out_path
