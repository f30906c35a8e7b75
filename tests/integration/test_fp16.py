"""The fp16 copy of the real default model (the one TensorRT and ONNX Runtime's CUDA provider run).

Checked on ONNX Runtime's CPU provider against fp32 with the app's agreement measure
(:mod:`app.models.quantization.agreement`) on vtest and bikes; docs/models.md gives the 100-frame figures.
"""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest

from app.errors import ModelError
from app.models.quantization.agreement import detection_agreement
from app.models.quantization.fp16 import convert_fp16, fp16_model
from app.models.store.files import sha256_file
from app.models.store.provenance import QUANTIZED_FROM

FRAMES = 20


@pytest.fixture(scope="module")
def fp16(default_model, tmp_path_factory):
    return convert_fp16(default_model, tmp_path_factory.mktemp("fp16") / "yolov3-tiny-fp16.onnx")


def test_fp16_model_is_fp16_inside_and_fp32_at_its_edges(fp16, default_model):
    model = onnx.load(str(fp16))
    onnx.checker.check_model(model)
    float_ = onnx.TensorProto.FLOAT
    assert all(v.type.tensor_type.elem_type == float_ for v in (*model.graph.input, *model.graph.output))
    weights = [t for t in model.graph.initializer if t.name.endswith("/W")]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names)), "duplicate node names: the converter's casts were not repaired"
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["detstream.precision"] == "fp16"
    assert meta[QUANTIZED_FROM] == sha256_file(default_model)


@pytest.mark.parametrize("clip", ["vtest", "bikes"])
def test_fp16_detections_agree_with_fp32(fp16, default_model, clip, request):
    result = detection_agreement(default_model, fp16, request.getfixturevalue(clip), frames=FRAMES)
    assert result["reference_detections"] > 0
    assert result["f1"] >= 0.98, result


def test_fp16_copies_are_cached_by_content(default_model, tmp_path):
    first = fp16_model(default_model, tmp_path)
    assert fp16_model(default_model, tmp_path) == first
    assert sha256_file(default_model)[:16] in first.name
    with pytest.raises(ModelError, match="already quantized or fp16"):
        convert_fp16(first, tmp_path / "again.onnx")


def test_quantize_command_makes_fp16_without_footage(default_model, tmp_path):
    out = tmp_path / "m-fp16.onnx"
    done = subprocess.run([sys.executable, "-m", "app", "quantize", str(default_model), "--precision", "fp16",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.exists() and f"wrote {out}" in done.stdout
    refused = subprocess.run([sys.executable, "-m", "app", "quantize", str(default_model)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "--calib" in refused.stderr
