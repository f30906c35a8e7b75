"""Output shapes of an ONNX model once its input height and width are fixed (both backends use it).

Why: exports with dynamic axes often declare outputs like ``(batch, 84,
anchors)`` or ``(batch, boxes, 85)``; the anchor count follows from the input
size, which the :class:`~app.types.ModelSpec` fixes (or, for a model with
dynamic height and width, the size a batch is letterboxed to). Running ONNX
shape inference with the input's spatial dims pinned turns such dims into
numbers, so the engines can preallocate outputs. A dim that stays unknown is
data-dependent (NMS row counts), and that output cannot be preallocated.
Runs on whichever thread asks (the engine thread for a new input size).

Memory: :class:`OutputShapes` reads the file once, when the engine is built,
and keeps a copy whose large initializers hold their dims but not their bytes
(shape inference reads only the small ones: reshape targets, slice bounds).
Parsing the whole model again for every new input size would leave about twice
the file's size resident (glibc keeps what protobuf freed); the light copy is
a few hundred kB.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.types import ModelSpec

logger = logging.getLogger(__name__)


LIGHT_INITIALIZER_BYTES = 4096
"""Initializers larger than this keep only their dims in the light copy (weights; shape inference never reads them)."""


class OutputShapes:
    """Output shapes of one model at any input size, from a weightless copy read once (see the module docstring)."""

    def __init__(self, path: Path, spec: ModelSpec, output_names: list[str]) -> None:
        self._path, self._spec, self._names = Path(path), spec, output_names
        self._light = _light_copy(self._path)

    def __call__(self, hw: tuple[int, int] | None = None) -> list[tuple[int, ...] | None]:
        """Per output (in ``output_names`` order): its shape without the batch dim, or None when not fixed.

        ``hw`` is the input (height, width) to pin; default the spec's nominal input size.
        """
        if self._light is None:
            return [None] * len(self._names)
        return _infer(self._light, self._path, self._spec, self._names, hw)


def _light_copy(path: Path) -> object | None:
    """The model with large initializers' bytes dropped (dims kept), or None when it cannot be read."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # unreadable here means "not preallocatable"; the session reports real problems
        logger.debug("cannot read %s for shape inference (%s); outputs allocated per run", path, error)
        return None
    for tensor in model.graph.initializer:
        if tensor.ByteSize() > LIGHT_INITIALIZER_BYTES:
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            tensor.ClearField("data_location")
            del tensor.external_data[:]
    light = onnx.ModelProto()
    light.CopyFrom(model)  # a fresh message: the parsed one's arena (the whole file) is freed with it
    return light


def _infer(light: object, path: Path, spec: ModelSpec, output_names: list[str],
           hw: tuple[int, int] | None) -> list[tuple[int, ...] | None]:
    import onnx

    height, width = hw or (spec.input_height, spec.input_width)
    try:
        model = onnx.ModelProto()
        model.CopyFrom(light)
        _pin_input(model, spec.input_name, height, width)
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as error:  # any failure only means "not preallocatable"
        logger.debug("shape inference on %s failed (%s); outputs allocated per run", path, error)
        return [None] * len(output_names)
    shapes: dict[str, tuple[int, ...] | None] = {}
    for value in list(inferred.graph.output):
        dims = value.type.tensor_type.shape.dim[1:]
        known = all(d.HasField("dim_value") and d.dim_value > 0 for d in dims)
        shapes[value.name] = tuple(d.dim_value for d in dims) if known else None
    return [shapes.get(name) for name in output_names]


def _pin_input(model: object, input_name: str, height: int, width: int) -> None:
    """Fix the channel, height and width of the model input; the batch dim stays as declared."""
    for value in model.graph.input:  # type: ignore[attr-defined]
        if value.name != input_name:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4:
            return
        for dim, size in zip(dims[1:], (3, height, width), strict=True):
            if not dim.HasField("dim_value"):
                dim.dim_value = size
