"""lab/ort_pixel_input.py: the uint8 copy of a model computes what the float model does on the converted pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from lab.ort_pixel_input import pixel_input_copy
from tests.unit.engines.engine_models import make_model


def test_the_pixel_input_copy_gives_the_float_models_outputs(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None, dynamic_hw=True)
    name = pixel_input_copy(Path(spec.path), tmp_path / "pixels.onnx", spec.scale)
    pixels = np.random.default_rng(2).integers(0, 256, (2, 8, 12, 3), dtype=np.uint8)
    floats = (pixels.transpose(0, 3, 1, 2) * np.float32(spec.scale)).astype(np.float32)
    want = ort.InferenceSession(spec.path, providers=["CPUExecutionProvider"]).run(None, {name: floats})
    copy = ort.InferenceSession(str(tmp_path / "pixels.onnx"), providers=["CPUExecutionProvider"])
    assert copy.get_inputs()[0].type == "tensor(uint8)"
    for got, expected in zip(copy.run(None, {"pixels": pixels}), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
