"""Output shapes at any input size, from a weightless copy of the model read once."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from app.engines.shapes import LIGHT_INITIALIZER_BYTES, OutputShapes
from app.models.spec import load_model_spec


@pytest.mark.parametrize(("hw", "boxes"), [((416, 416), 2535), ((320, 416), 1950), ((192, 416), 1170), (None, 2535)])
def test_the_default_models_boxes_follow_the_input_size(default_model: Path, hw, boxes):
    spec = load_model_spec(default_model)
    assert OutputShapes(default_model, spec, ["output"])(hw) == [(boxes, 85)]


def test_the_kept_copy_holds_the_weights_dims_but_not_their_bytes(default_model: Path):
    spec = load_model_spec(default_model)
    shapes = OutputShapes(default_model, spec, ["output"])
    light = shapes._light
    full = onnx.load(str(default_model))
    assert light.ByteSize() < full.ByteSize() / 50  # ~35 MB of weights are not kept while the worker runs
    dims = {t.name: list(t.dims) for t in full.graph.initializer}
    assert {t.name: list(t.dims) for t in light.graph.initializer} == dims
    assert all(t.ByteSize() <= LIGHT_INITIALIZER_BYTES or not t.raw_data for t in light.graph.initializer)


def test_an_unreadable_file_means_not_preallocatable_rather_than_an_error(tmp_path: Path, default_model: Path):
    spec = load_model_spec(default_model)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    assert OutputShapes(broken, spec, ["output"])((320, 416)) == [None]
