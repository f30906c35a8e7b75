"""Reading a model's :class:`ModelSpec` from its ONNX file, with one clear error per way it can be wrong.

The file is the source of truth: input size, layout and class names travel in
``metadata_props`` (``detstream.*`` keys; Ultralytics' ``names``/``imgsz`` are
read too), so ``--model path.onnx`` needs no side files. Precedence:

* layout (:mod:`app.postprocess.layouts`): ``model.format``
  (``layout_override``), trusted whenever the output shape can hold it; else
  ``detstream.layout``, which must also be oriented as that layout's models
  are; else inferred from the output shape when exactly one layout says so
  (an ambiguous shape is an error asking for ``model.format``). An override
  that contradicts the metadata, or a layout the output shape cannot hold, is
  an error naming both, never a guess.
* class names: ``model.names_file``, else ``detstream.class_names``, else
  Ultralytics ``names``, else COCO-80 (for 80 classes or an nms output).
* input size: the graph's fixed H×W, else ``detstream.input_size``, else
  Ultralytics ``imgsz``, else 640. A graph whose H and W are both symbolic is
  ``dynamic_hw``: the size is then the nominal (largest) one, and
  ``stride`` (``detstream.stride``, else Ultralytics ``stride``, else 32) is
  what a rectangular input's sides must be multiples of.

Every :class:`ModelError` is one line that starts with the file's path.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from app.errors import ModelError
from app.models.coco import COCO80
from app.postprocess.layouts import LAYOUTS, fitting_layouts, infer_layout, known
from app.postprocess.layouts.base import Dim, show
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_INPUT_SIZE = 640
DEFAULT_STRIDE = 32  # YOLO's largest downsampling factor, when the file does not say
_SNIFF = (
    (b"\xff\xd8\xff", "it looks like a JPEG image"),
    (b"\x89PNG", "it looks like a PNG image"),
    (b"PK\x03\x04", "it looks like a zip archive, e.g. a PyTorch checkpoint: export it to ONNX first"),
    (b"\x1f\x8b", "it looks like a gzip file"),
)


DISABLED_OPTIMIZERS = "detstream.ort_disabled_optimizers"
"""Metadata key: comma-separated ONNX Runtime graph optimizers that sessions of the model must not run."""


def _what_it_looks_like(data: bytes) -> str:
    """A hint for the error message: what a file that is not ONNX seems to be."""
    for magic, what in _SNIFF:
        if data.startswith(magic):
            return what
    head = data[:256]
    if head and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "it looks like a text file"
    if head[:1] == b"\x08":  # field 1 (ir_version) as a varint: how every ONNX file begins
        return "it starts like one but does not parse: truncated or damaged?"
    return "it does not parse as protobuf"


def _parse(path: Path) -> tuple[onnx.ModelProto, str]:
    """The parsed model (without external weights) and the sha256 of exactly the bytes parsed."""
    if not path.exists():
        raise ModelError(f"{path}: no such model file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, not an ONNX model file")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"{path}: cannot read model file ({error.strerror or error})") from None
    if not data:
        raise ModelError(f"{path}: not an ONNX model (the file is empty)")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeWarning, ValueError) as error:
        logger.debug("%s: protobuf parse failed: %s", path, error)
        raise ModelError(f"{path}: not an ONNX model ({_what_it_looks_like(data)})") from None
    if not model.graph.node or not model.graph.output or not model.graph.input:
        raise ModelError(f"{path}: not an ONNX model, or a truncated one (no graph nodes, inputs or outputs; "
                         f"{_what_it_looks_like(data)})")
    return model, hashlib.sha256(data).hexdigest()


def _dims(value_info: onnx.ValueInfoProto) -> list[Dim]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _input(path: Path, model: onnx.ModelProto) -> tuple[str, list[Dim]]:
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ModelError(f"{path}: expected one image input, found {len(inputs)} ({[i.name for i in inputs]})")
    image = inputs[0]
    dims = _dims(image)
    if len(dims) != 4 or dims[1] != 3:
        raise ModelError(f"{path}: input {image.name!r} has shape {show(dims)}; expected [N, 3, H, W] (NCHW, RGB)")
    elem_type = image.type.tensor_type.elem_type
    if elem_type != onnx.TensorProto.FLOAT:
        type_name = onnx.TensorProto.DataType.Name(elem_type).lower()
        raise ModelError(f"{path}: input {image.name!r} is {type_name}; detstream feeds float32 (export with fp32 I/O)")
    return image.name, dims


def _input_size(path: Path, dims: list[Dim], meta: dict[str, str]) -> tuple[int, int]:
    if isinstance(dims[2], int) and dims[2] > 0 and isinstance(dims[3], int) and dims[3] > 0:
        return dims[2], dims[3]
    try:
        if "detstream.input_size" in meta:
            height, width = meta["detstream.input_size"].lower().split("x")
            return int(height), int(width)
        if "imgsz" in meta:  # Ultralytics: "[640, 640]"
            height, width = ast.literal_eval(meta["imgsz"])
            return int(height), int(width)
    except (ValueError, SyntaxError, TypeError) as error:
        raise ModelError(f"{path}: malformed input size in metadata ({error})") from None
    return DEFAULT_INPUT_SIZE, DEFAULT_INPUT_SIZE


def _is_dynamic_hw(dims: list[Dim]) -> bool:
    """True when neither H nor W is a fixed positive size (symbolic names or absent)."""
    return not any(isinstance(d, int) and d > 0 for d in dims[2:])


def _stride(path: Path, meta: dict[str, str]) -> int:
    key = "detstream.stride" if "detstream.stride" in meta else "stride" if "stride" in meta else None
    if key is None:
        return DEFAULT_STRIDE
    try:
        value = ast.literal_eval(meta[key].strip())  # "32"; a list of per-head strides means its largest
        stride = int(max(value) if isinstance(value, list | tuple) else value)
    except (ValueError, SyntaxError, TypeError):
        stride = 0
    if stride < 1:
        raise ModelError(f"{path}: metadata {key}={meta[key]!r} is not a positive integer stride")
    return stride


def _layout(path: Path, shape: list[Dim], meta: dict[str, str], override: str | None) -> str:
    declared_meta = meta.get("detstream.layout")
    for source, value in (("model.format", override), ("metadata detstream.layout", declared_meta)):
        if value is not None and value not in LAYOUTS:
            raise ModelError(f"{path}: {source} is {value!r}, not a known layout ({known()})")
    if override and declared_meta and override != declared_meta:
        raise ModelError(f"{path}: model.format says {override} but the file's metadata says {declared_meta}")
    inferred = infer_layout(shape)
    declared = override or declared_meta
    if declared is None:
        if inferred is not None:
            return inferred
        candidates = fitting_layouts(shape)
        if len(candidates) > 1:
            could_be = " or ".join(f"{name} {LAYOUTS[name].shape}" for name in candidates)
            raise ModelError(f"{path}: output shape {show(shape)} is ambiguous (it could be {could_be}); "
                             "set model.format to say which")
        listed = "; ".join(f"{name} {layout.shape}" for name, layout in LAYOUTS.items())
        raise ModelError(f"{path}: output shape {show(shape)} matches no known layout ({listed}); "
                         "set model.format if it is one of them")
    layout = LAYOUTS[declared]
    # the user's model.format is trusted on any shape that can hold it; metadata must also be oriented as usual
    if not (layout.fits(shape) if override else layout.oriented(shape)):
        source = "model.format" if override else "metadata"
        hint = f"; it looks like {inferred}" if inferred else ""
        raise ModelError(f"{path}: layout {declared} (from {source}) does not fit output shape {show(shape)} "
                         f"({declared} is {layout.shape}){hint}")
    return declared


def _read_names_file(names_file: str) -> tuple[str, ...]:
    try:
        text = Path(names_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(f"model.names_file {names_file}: cannot read ({error})") from None
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _names_from_metadata(path: Path, meta: dict[str, str]) -> tuple[str, ...] | None:
    try:
        if "detstream.class_names" in meta:
            return tuple(str(n) for n in json.loads(meta["detstream.class_names"]))
        if "names" in meta:  # Ultralytics: "{0: 'person', 1: 'bicycle', ...}"
            table = ast.literal_eval(meta["names"])
            return tuple(str(table[i]) for i in sorted(table)) if isinstance(table, dict) else tuple(table)
    except (ValueError, SyntaxError, TypeError) as error:
        raise ModelError(f"{path}: malformed class names in metadata ({error})") from None
    return None


def _names(path: Path, meta: dict[str, str], names_file: str | None, count: int | None) -> tuple[str, ...]:
    names = _read_names_file(names_file) if names_file else _names_from_metadata(path, meta)
    if names is None:
        names = COCO80 if count in (None, 80) else tuple(f"class{i}" for i in range(count))
    if count is not None and len(names) != count:
        given = f"model.names_file {names_file}" if names_file else "the file's metadata"
        raise ModelError(f"{path}: the output has {count} classes but {given} gives {len(names)} class names")
    return names


def load_model_spec(path: Path | str, *, name: str | None = None, layout_override: str | None = None,
                    names_file: str | None = None) -> ModelSpec:
    """Read and check an ONNX detector; every failure is a one-line :class:`ModelError` naming the file.

    Checks: the file exists and parses as ONNX (a text file, an image or a
    truncated download is named as such), one float32 ``[N, 3, H, W]`` image
    input, and a first output that fits the layout. ``static_batch`` is the
    input's fixed batch dimension, None when symbolic; ``dynamic_hw`` is true
    when H and W are both symbolic (see the module docstring for size and stride).
    """
    path = Path(path)
    model, sha256 = _parse(path)
    meta = {prop.key: prop.value for prop in model.metadata_props}
    input_name, dims = _input(path, model)
    out_shape = _dims(model.graph.output[0])
    layout = _layout(path, out_shape, meta, layout_override)
    height, width = _input_size(path, dims, meta)
    try:
        scale = float(meta.get("detstream.scale", 1.0 / 255.0))
    except ValueError:
        raise ModelError(f"{path}: metadata detstream.scale={meta['detstream.scale']!r} is not a number") from None
    return ModelSpec(
        name=name or meta.get("detstream.name") or path.stem,
        path=str(path),
        input_name=input_name,
        input_height=height,
        input_width=width,
        layout=layout,
        class_names=_names(path, meta, names_file, LAYOUTS[layout].class_count(out_shape)),
        static_batch=dims[0] if isinstance(dims[0], int) and dims[0] > 0 else None,
        scale=scale,
        sha256=sha256,
        dynamic_hw=_is_dynamic_hw(dims),
        stride=_stride(path, meta),
        ort_disabled_optimizers=tuple(n.strip() for n in meta.get(DISABLED_OPTIMIZERS, "").split(",") if n.strip()),
    )
