"""Reading a model's :class:`ModelSpec` from its ONNX file, with one clear error per way it can be wrong.

The file is the single source of truth: input size, layout and class names
travel in ``metadata_props`` (``detstream.*`` keys), so ``--model path.onnx``
needs no side files. Config may override the layout (``model.format``) and the
names (``model.names_file``); a declared layout that disagrees with the
output shape is an error, not a guess.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from app.errors import ModelError
from app.models.cache import sha256_file
from app.models.coco import COCO80
from app.types import ModelSpec

Dim = int | str | None
LAYOUTS = ("yolov5", "yolov8", "nms")


def _dims(value_info: onnx.ValueInfoProto) -> list[Dim]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _load(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelError(f"{path}: no such model file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, not an ONNX model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as error:
        raise ModelError(f"{path}: not an ONNX model (cannot parse: {str(error).splitlines()[0][:120]})") from None
    if not model.graph.output or not model.graph.input or not model.graph.node:
        raise ModelError(f"{path}: not an ONNX model, or a truncated one (no graph inputs, outputs or nodes)")
    return model


def infer_layout(shape: list[Dim]) -> str | None:
    """The layout an output shape implies, or None when the shape cannot tell."""
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
        return None
    rows, cols = shape[1], shape[2]
    if cols == 6 and rows <= 1000:
        return "nms"
    if rows > cols and cols > 5:
        return "yolov5"
    if cols > rows and rows > 4:
        return "yolov8"
    return None


def _class_count(layout: str, shape: list[Dim]) -> int | None:
    if layout == "yolov5" and isinstance(shape[2], int):
        return shape[2] - 5
    if layout == "yolov8" and isinstance(shape[1], int):
        return shape[1] - 4
    return None


def _names(path: Path, meta: dict[str, str], names_file: str | None, count: int | None) -> tuple[str, ...]:
    if names_file:
        try:
            names = tuple(line.strip() for line in Path(names_file).read_text().splitlines() if line.strip())
        except OSError as error:
            raise ModelError(f"model.names_file {names_file}: {error.strerror}") from None
    elif "detstream.class_names" in meta:
        names = tuple(json.loads(meta["detstream.class_names"]))
    elif count in (None, 80):
        names = COCO80
    else:
        names = tuple(f"class{i}" for i in range(count))
    if count is not None and len(names) != count:
        raise ModelError(f"{path}: the model has {count} classes but {len(names)} class names were given")
    return names


def _input(path: Path, model: onnx.ModelProto) -> tuple[str, list[Dim]]:
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ModelError(f"{path}: expected one image input, found {len(inputs)}")
    dims = _dims(inputs[0])
    if len(dims) != 4 or dims[1] != 3:
        raise ModelError(f"{path}: input {inputs[0].name!r} has shape {dims}; expected [N, 3, H, W] (NCHW, RGB)")
    return inputs[0].name, dims


def _input_size(dims: list[Dim], meta: dict[str, str]) -> tuple[int, int]:
    if isinstance(dims[2], int) and isinstance(dims[3], int):
        return dims[2], dims[3]
    if "detstream.input_size" in meta:
        height, width = meta["detstream.input_size"].lower().split("x")
        return int(height), int(width)
    return 640, 640


def load_model_spec(path: Path | str, *, name: str | None = None, layout_override: str | None = None,
                    names_file: str | None = None) -> ModelSpec:
    """Read and check a model; every failure is a one-line :class:`ModelError` naming the file."""
    path = Path(path)
    model = _load(path)
    meta = {prop.key: prop.value for prop in model.metadata_props}
    input_name, dims = _input(path, model)
    out_shape = _dims(model.graph.output[0])
    declared = layout_override or meta.get("detstream.layout")
    inferred = infer_layout(out_shape)
    if declared is not None and declared not in LAYOUTS:
        raise ModelError(f"{path}: unknown layout {declared!r} (known: {', '.join(LAYOUTS)})")
    layout = declared or inferred
    if layout is None:
        raise ModelError(f"{path}: output shape {out_shape} matches no known layout "
                         f"({', '.join(LAYOUTS)}); set model.format if it is one of them")
    height, width = _input_size(dims, meta)
    spec = ModelSpec(name=name or meta.get("detstream.name") or path.stem, path=str(path), input_name=input_name,
                     input_height=height, input_width=width, layout=layout,
                     class_names=_names(path, meta, names_file, _class_count(layout, out_shape)),
                     static_batch=dims[0] if isinstance(dims[0], int) else None,
                     scale=float(meta.get("detstream.scale", 1.0 / 255.0)), sha256=sha256_file(path))
    from app.postprocess.yolo import check_layout

    try:
        check_layout(spec, [out_shape])
    except ModelError as error:
        raise ModelError(f"{path}: {error}") from None
    return spec
