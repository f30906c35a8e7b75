"""Static INT8 quantization (QDQ, per-channel) of a detector, calibrated on the operator's footage.

``detstream quantize MODEL.onnx --calib VIDEO_OR_DIR`` writes
``<model>-int8.onnx`` (``models/yolov3-tiny-int8.onnx`` for the default model).
The backbone runs in INT8; the decode tail (sigmoid/exp/grid/anchor math, the
reshapes and the final concat: every node with no convolution after it) stays
in fp32, because box coordinates in pixels and probabilities near 0 and 1 are
exactly what one 8-bit scale per tensor represents badly. So does the stem
(the first convolution, on the image itself, with its activation and pooling:
:func:`stem_nodes`): it has 27 weights per output channel and feeds every
later layer, and INT8 kernels run a 3-channel input poorly anyway, so keeping
it in fp32 is both closer to fp32 and faster. The defaults are the best
settings on x86 CPUs (docs/models.md); the alternatives stay reachable
through :class:`QuantOptions` for other hardware.

A model with a dynamic input size stays dynamic: calibration frames are
letterboxed as the pipeline will feed them (rectangular, see
:mod:`app.models.quantization.calibration`), and the output records the fp32 file it came
from (``detstream.quantized_from``, its sha256) so a stale INT8 model can be
told from a current one (:mod:`app.models.store.provenance`).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from app.errors import ModelError
from app.models.quantization.calibration import FrameReader, InputFit, calibration_frames
from app.models.spec import DISABLED_OPTIMIZERS, load_model_spec
from app.models.store.files import atomic_output
from app.models.store.provenance import (
    CALIBRATED_ON,
    CALIBRATION_FRAMES,
    QUANTIZED_FROM,
    QUANTIZER_VERSION,
    QUANTIZER_VERSION_KEY,
)
from app.postprocess.layouts import LAYOUTS

logger = logging.getLogger(__name__)

HEAD_PREFIX = "head/"
STEM_OPTIMIZER_OFF = "QDQPropagationTransformer"
"""Listed under ``detstream.ort_disabled_optimizers`` for a model with an fp32 stem: that pass
moves the stem's QuantizeLinear above its MaxPool, which then runs on uint8 in
ONNX Runtime's plain NCHW kernel, an order of magnitude slower than the fp32
NCHWc one. The move changes no value (max-pooling commutes with a
monotonic quantization), so skipping it changes only the speed."""
STEM_OPS = frozenset({"Relu", "LeakyRelu", "Clip", "MaxPool", "BatchNormalization", "HardSigmoid"})
"""Single-input operators that may follow the first convolution inside the fp32 stem."""
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
_METHODS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}


@dataclass(frozen=True, slots=True)
class QuantOptions:
    """How to quantize; the defaults are the best settings on x86 CPUs (see docs/models.md).

    ``exclude_output_convs`` also keeps the convolutions that feed only the
    decode (the 1x1 detection convs) in fp32. ``moving_average`` smooths the
    per-frame min/max (ORT's ``CalibMovingAverage``, constant 0.01) instead of
    taking the extremes over all frames: one odd frame no longer stretches a
    range, which keeps the INT8 model's detections closer to fp32's. It
    weights early frames more, which is why frames are spread over
    the whole clip.
    """

    quant_format: Literal["qdq", "qoperator"] = "qdq"
    per_channel: bool = True
    reduce_range: bool = False
    activation_symmetric: bool = False
    activation_type: Literal["int8", "uint8"] = "uint8"
    method: Literal["minmax", "entropy", "percentile"] = "minmax"
    moving_average: bool = True
    exclude_output_convs: bool = False
    preprocess: bool = True
    fp32_stem: bool = True  # see stem_nodes


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    table: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            table.setdefault(name, []).append(node)
    return table


def head_nodes(model: onnx.ModelProto, include_output_convs: bool = False) -> list[str]:
    """Names of the nodes that form the decode tail: no convolution (or matmul) anywhere after them.

    Found from the graph's structure, so it holds for any exported YOLO, and
    unioned with the converter's ``head/`` names. ``include_output_convs`` adds
    the convolutions whose every consumer is in that tail.
    """
    graph = model.graph
    consumers = _consumers(graph)
    feeds_compute: dict[str, bool] = {}
    for node in reversed(graph.node):  # ONNX graphs are topologically sorted
        downstream = [c for out in node.output for c in consumers.get(out, [])]
        feeds_compute[node.name] = any(c.op_type in COMPUTE_OPS or feeds_compute.get(c.name, False)
                                       for c in downstream)
    tail = {n.name for n in graph.node if n.op_type not in COMPUTE_OPS and not feeds_compute[n.name]}
    tail |= {n.name for n in graph.node if n.name.startswith(HEAD_PREFIX)}
    if include_output_convs:
        for node in graph.node:
            downstream = [c for out in node.output for c in consumers.get(out, [])]
            if node.op_type in COMPUTE_OPS and downstream and all(c.name in tail for c in downstream):
                tail.add(node.name)
    return [n.name for n in graph.node if n.name in tail]


def stem_nodes(model: onnx.ModelProto) -> list[str]:
    """The first convolution on the image input and the chain of activations and pooling right after it.

    The chain stops at the next convolution, at a branch (an output with more
    than one consumer, as in SiLU's ``x * sigmoid(x)``) or at any operator not
    in :data:`STEM_OPS`, so for such models the stem is the convolution alone.
    Empty when no convolution reads the graph input directly.
    """
    graph = model.graph
    inputs = {i.name for i in graph.input} - {init.name for init in graph.initializer}
    first = next((n for n in graph.node if n.op_type == "Conv" and n.input and n.input[0] in inputs), None)
    if first is None:
        return []
    consumers = _consumers(graph)
    stem, node = [first.name], first
    while len(node.output) == 1 and len(after := consumers.get(node.output[0], [])) == 1 \
            and after[0].op_type in STEM_OPS:
        node = after[0]
        stem.append(node.name)
    return stem


def _copy_metadata(source: onnx.ModelProto, target_path: Path, precision: str, source_sha256: str,
                   extra: dict[str, str]) -> None:
    model = onnx.load(str(target_path))
    meta = {p.key: p.value for p in source.metadata_props}
    meta.update(extra)
    meta["detstream.precision"] = precision
    meta[QUANTIZED_FROM] = source_sha256
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, meta)
    onnx.save(model, str(target_path))


def default_output(model_path: Path) -> Path:
    """``<stem>-int8.onnx`` beside the fp32 model (``models/yolov3-tiny-int8.onnx`` for the default one)."""
    return model_path.with_name(f"{model_path.stem}-int8.onnx")


def quantize_model(model_path: Path | str, calib_source: Path | str, out_path: Path | str | None = None,
                   frames: int = 100, *, options: QuantOptions | None = None) -> Path:
    """Write a static INT8 model of ``model_path`` calibrated on ``frames`` frames of ``calib_source``.

    ``calib_source`` is a video file (frames evenly sampled over its length,
    decoded with PyAV) or a folder of images, letterboxed at the size the
    pipeline feeds each frame (:meth:`InputFit.of`). The output keeps the
    input's dynamic dimensions and ``metadata_props``, plus
    ``detstream.precision=int8``, ``detstream.quantized_from`` (the fp32
    file's sha256) and ``detstream.calibrated_on``/``calibration_frames``
    (the footage's file name, and how many frames); it is written to a
    temporary file and renamed, so a failed run leaves no half model.
    Raises :class:`ModelError` for an unreadable model or calibration source.
    """
    options = options or QuantOptions()
    model_path = Path(model_path)
    out = Path(out_path) if out_path else default_output(model_path)
    if frames < 1:
        raise ModelError(f"quantize: frames must be at least 1, got {frames}")
    spec = load_model_spec(model_path)
    source_model = onnx.load(str(model_path))
    if any(node.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv") for node in source_model.graph.node):
        raise ModelError(f"{model_path}: already quantized; quantize the fp32 model instead")
    if LAYOUTS[spec.layout].suppressed:
        logger.warning("%s: an in-graph NMS output quantizes poorly; check the agreement numbers", model_path)
    data = calibration_frames(Path(calib_source), frames, InputFit.of(spec))
    with tempfile.TemporaryDirectory(prefix="detstream-quantize-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        if options.preprocess:
            quant_pre_process(str(model_path), str(prepared), skip_symbolic_shape=True)
        else:
            onnx.save(source_model, str(prepared))
        graph = onnx.load(str(prepared))
        excluded = head_nodes(graph, options.exclude_output_convs)
        stem = stem_nodes(graph) if options.fp32_stem else []
        excluded += [name for name in stem if name not in excluded]
        extra = {QUANTIZER_VERSION_KEY: QUANTIZER_VERSION, CALIBRATED_ON: Path(calib_source).name,
                 CALIBRATION_FRAMES: str(len(data))}
        if stem:
            extra[DISABLED_OPTIMIZERS] = STEM_OPTIMIZER_OFF
        sizes = sorted({frame.shape[1:] for frame in data})
        logger.info("quantize: %s in INT8, %d decode nodes and a %d-node stem (%s) kept in fp32, "
                    "%d calibration frames at %s", model_path.name, len(excluded) - len(stem), len(stem),
                    ", ".join(stem) or "none", len(data), ", ".join(f"{h}x{w}" for h, w in sizes))
        activation = QuantType.QInt8 if options.activation_type == "int8" else QuantType.QUInt8
        with atomic_output(out) as partial:
            quantize_static(
                str(prepared), str(partial), FrameReader(spec.input_name, data),
                quant_format=QuantFormat.QDQ if options.quant_format == "qdq" else QuantFormat.QOperator,
                per_channel=options.per_channel, reduce_range=options.reduce_range,
                activation_type=activation, weight_type=QuantType.QInt8,
                nodes_to_exclude=excluded, calibrate_method=_METHODS[options.method],
                extra_options={"ActivationSymmetric": options.activation_symmetric, "WeightSymmetric": True,
                               "CalibMovingAverage": options.moving_average},
            )
            _copy_metadata(source_model, partial, "int8", spec.sha256, extra)
    logger.info("quantize: wrote %s", out)
    return out


def quantize_command(model_path: Path, precision: str, calib_source: Path | None, out_path: Path | None,
                     frames: int = 100) -> Path:
    """``detstream quantize``: INT8 needs calibration footage (``--calib``); fp16 needs none."""
    if precision == "fp16":
        from app.models.quantization.fp16 import convert_fp16

        return convert_fp16(model_path, out_path)
    if calib_source is None:
        raise ModelError("quantize: --precision int8 needs --calib VIDEO_OR_DIR (footage to calibrate on)")
    return quantize_model(model_path, calib_source, out_path, frames=frames)
