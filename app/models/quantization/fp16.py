"""An fp16 copy of a detector, for GPUs: fp16 weights and activations, fp32 inputs, outputs and decode tail.

``detstream quantize MODEL.onnx --precision fp16`` writes ``<model>-fp16.onnx``; the TensorRT engine
and ONNX Runtime's CUDA provider make (and cache) the same copy themselves through :func:`fp16_model`.
TensorRT 11 has no "run this fp32 network in fp16" flag: every network is strongly typed, so the
precision a GPU runs in is the precision the ONNX model declares, and this module is where fp16 is
decided.

The converter is ONNX Runtime's own (``onnxruntime.transformers.float16``, shipped with the
``onnxruntime`` package detstream already needs). Kept in fp32:

* the graph's inputs and outputs (``keep_io_types``): the pipeline feeds fp32 frames and decodes fp32
  outputs on every backend, so nothing outside the engine changes;
* the decode tail (:func:`app.models.quantization.quantize.head_nodes`: every node with no convolution
  after it, i.e. the sigmoid/exp/grid/anchor math and the final concat), for the same reason the INT8
  quantizer keeps it: box coordinates in pixels and probabilities near 0 and 1 lose digits in fp16;
* the operators the converter itself blocks by default (those without fp16 kernels).

Copies are cached by the source model's content (sha256), so a retrained model with the same file
name never reuses an old copy. The output records ``detstream.precision=fp16`` and
``detstream.quantized_from`` (the source's sha256), as the INT8 model does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from app.errors import ModelError
from app.models.store.files import atomic_output, sha256_file
from app.models.store.provenance import QUANTIZED_FROM

logger = logging.getLogger(__name__)

PRECISION_KEY = "detstream.precision"
FP16_CONVERTER_VERSION = "1"
"""Part of the cache name: a change in what is kept in fp32 must not reuse copies made before it."""


def default_fp16_output(model_path: Path) -> Path:
    """``<stem>-fp16.onnx`` beside the fp32 model (``models/yolov3-tiny-fp16.onnx`` for the default one)."""
    return model_path.with_name(f"{model_path.stem}-fp16.onnx")


def convert_fp16(model_path: Path | str, out_path: Path | str | None = None, *,
                 source_sha256: str | None = None) -> Path:
    """Write the fp16 copy of ``model_path`` (see the module docstring) to ``out_path``; returns the path.

    Written to a temporary file and renamed, so a failed run leaves no half model. Raises
    :class:`ModelError` for an unreadable or already reduced-precision model.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from app.models.quantization.quantize import head_nodes

    model_path = Path(model_path)
    out = Path(out_path) if out_path else default_fp16_output(model_path)
    try:
        model = onnx.load(str(model_path))
    except Exception as error:
        raise ModelError(f"{model_path}: not a readable ONNX model ({error})") from None
    if _is_reduced(model):
        raise ModelError(f"{model_path}: already quantized or fp16; convert the fp32 model instead")
    tail = head_nodes(model)
    converted = _tidy(convert_float_to_float16(model, keep_io_types=True, node_block_list=tail))
    meta = {p.key: p.value for p in model.metadata_props}
    meta[PRECISION_KEY] = "fp16"
    meta[QUANTIZED_FROM] = source_sha256 or sha256_file(model_path)
    del converted.metadata_props[:]
    onnx.helper.set_model_props(converted, meta)
    with atomic_output(out) as partial:
        onnx.save(converted, str(partial))
    logger.info("fp16: wrote %s (%d decode nodes kept in fp32)", out, len(tail))
    return out


def fp16_model(model_path: Path | str, cache_dir: Path, sha256: str | None = None) -> Path:
    """The cached fp16 copy of ``model_path`` under ``cache_dir``, made on first use (keyed by content)."""
    model_path = Path(model_path)
    digest = sha256 or sha256_file(model_path)
    path = Path(cache_dir) / f"{model_path.stem}-fp16-{digest[:16]}-v{FP16_CONVERTER_VERSION}.onnx"
    if not path.exists():
        logger.info("fp16: converting %s for the GPU (cached as %s)", model_path.name, path)
        convert_fp16(model_path, path, source_sha256=digest)
    return path


def _tidy(model: onnx.ModelProto) -> onnx.ModelProto:
    """Repair and sort what the converter leaves around kept-fp32 nodes.

    The converter adds one fp16→fp32 ``Cast`` per kept-fp32 *consumer* of a tensor (the same name each
    time: an invalid graph when a tensor feeds two of them, as a YOLO head's transpose feeds its
    xy/wh/score slices), and between two kept-fp32 nodes it casts fp32→fp16→fp32, losing exactly the
    digits the nodes were kept for. Duplicates are dropped, such round trips become an ``Identity`` of the
    fp32 tensor, casts nobody reads are removed, and the nodes are put back in topological order
    (ONNX requires it; the converter appends its casts at the end).
    """
    graph = model.graph
    elem = onnx.TensorProto
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)}
    nodes, seen = [], set()
    for node in graph.node:
        key = (node.op_type, tuple(node.input), tuple(node.output))
        if node.op_type == "Cast" and key in seen:
            continue
        seen.add(key)
        nodes.append(node)
    producer = {out: node for node in nodes for out in node.output}
    for index, node in enumerate(nodes):
        source = producer.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if (_cast_to(node) == elem.FLOAT and source is not None and _cast_to(source) == elem.FLOAT16
                and types.get(source.input[0]) == elem.FLOAT):
            nodes[index] = onnx.helper.make_node("Identity", [source.input[0]], list(node.output), name=node.name)
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        kept = [n for n in nodes if n.op_type != "Cast" or any(out in read for out in n.output)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(_topological(graph, nodes))
    return model


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _topological(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(nodes), []
    while pending:
        runnable = [n for n in pending if all(name in ready for name in n.input)]
        if not runnable:
            raise ModelError("fp16: the converted graph has a cycle or an unproduced input")
        for node in runnable:
            ordered.append(node)
            ready.update(node.output)
        pending = [n for n in pending if n not in runnable]
    return ordered


def _is_reduced(model: onnx.ModelProto) -> bool:
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get(PRECISION_KEY) in ("fp16", "int8"):
        return True
    quant_ops = {"QuantizeLinear", "DequantizeLinear", "QLinearConv"}
    return any(node.op_type in quant_ops for node in model.graph.node)
