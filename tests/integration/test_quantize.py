"""INT8 quantization of the real default model, calibrated on 20 vtest frames, checked against fp32.

The comparison uses test_default_model's own letterbox/decode/NMS, not the
app's, so a shared decode bug cannot hide a quantization one. The default
model's input is dynamic, so it is calibrated, and compared here, on the
416x320 rectangle the pipeline feeds for vtest's 4:3 frames.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.models.quantization.calibration import evenly_spaced
from app.models.quantization.quantize import quantize_model
from app.models.spec import load_model_spec
from app.models.store.provenance import calibration_of, stale_int8_reason
from tests.integration.test_default_model import RECT, class_names, detect, frames, letterbox

CALIBRATION_FRAMES = 20
CALIBRATED = evenly_spaced(795, CALIBRATION_FRAMES)
HELD_OUT = tuple((a + b) // 2 for a, b in zip(CALIBRATED[::3], CALIBRATED[1::3], strict=False))  # between them


@pytest.fixture(scope="module")
def int8_model(default_model, vtest, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "yolov3-tiny-int8.onnx"
    return quantize_model(default_model, vtest, out, frames=CALIBRATION_FRAMES)


@pytest.fixture(scope="module")
def held_out_frames(vtest):
    assert len(HELD_OUT) >= 6 and not set(HELD_OUT) & set(CALIBRATED)
    return frames(vtest, HELD_OUT)


def match_f1(reference, candidate, iou: float = 0.5) -> float:
    """Greedy one-to-one matching by candidate score: same label and IoU >= ``iou``."""
    matched = 0
    for ref, cand in zip(reference, candidate, strict=True):
        taken = [False] * len(ref)
        for label, _, box in sorted(cand, key=lambda d: -d[1]):
            best, best_iou = None, iou
            for j, (ref_label, _, ref_box) in enumerate(ref):
                if taken[j] or ref_label != label:
                    continue
                tl, br = np.maximum(box[:2], ref_box[:2]), np.minimum(box[2:], ref_box[2:])
                inter = np.prod(np.clip(br - tl, 0, None))
                union = np.prod(box[2:] - box[:2]) + np.prod(ref_box[2:] - ref_box[:2]) - inter
                if inter / union >= best_iou:
                    best, best_iou = j, inter / union
            if best is not None:
                taken[best] = True
                matched += 1
    n_ref, n_cand = sum(map(len, reference)), sum(map(len, candidate))
    precision, recall = matched / max(n_cand, 1), matched / max(n_ref, 1)
    return 2 * precision * recall / max(precision + recall, 1e-9)


def test_int8_detections_agree_with_fp32_on_held_out_frames(default_model, int8_model, held_out_frames):
    names = class_names(default_model)
    fp32 = ort.InferenceSession(str(default_model), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(int8_model), providers=["CPUExecutionProvider"])
    reference = [detect(fp32, rgb, names, RECT["vtest"]) for rgb in held_out_frames]
    candidate = [detect(int8, rgb, names, RECT["vtest"]) for rgb in held_out_frames]
    assert sum(map(len, reference)) >= 20  # enough detections for the F1 to mean something
    assert match_f1(reference, candidate) >= 0.9


@pytest.mark.parametrize(("size", "boxes"), [((416, 416), 2535), (RECT["vtest"], 1950), ((352, 416), 2145)])
def test_int8_outputs_are_probabilities_and_pixel_boxes_in_a_dynamic_batch_and_size(int8_model, held_out_frames,
                                                                                   size, boxes):
    int8 = ort.InferenceSession(str(int8_model), providers=["CPUExecutionProvider"])
    batch = np.stack([letterbox(rgb, size)[0] for rgb in held_out_frames[:3]])
    out = int8.run(["output"], {"images": batch})[0]
    assert out.shape == (3, boxes, 85) and np.isfinite(out).all()
    assert out[..., 4:].min() >= 0.0 and out[..., 4:].max() <= 1.0
    assert out[..., 4].max() > 0.9  # someone is detected with confidence
    assert (out[..., 2:4] > 0).all()


def test_the_int8_model_keeps_the_metadata_and_a_fp32_decode_tail(default_model, int8_model):
    model = onnx.load(str(int8_model))
    meta = {p.key: p.value for p in model.metadata_props}
    source = {p.key: p.value for p in onnx.load(str(default_model), load_external_data=False).metadata_props}
    fp32_sha256 = hashlib.sha256(default_model.read_bytes()).hexdigest()
    assert meta == {**source, "detstream.precision": "int8", "detstream.quantized_from": fp32_sha256,
                    "detstream.quantizer_version": "2",
                    "detstream.ort_disabled_optimizers": "QDQPropagationTransformer",
                    "detstream.calibrated_on": "vtest.avi", "detstream.calibration_frames": str(CALIBRATION_FRAMES)}
    assert stale_int8_reason(int8_model, default_model) is None
    assert calibration_of(int8_model) == ("vtest.avi", CALIBRATION_FRAMES)  # the name only, never the path
    assert json.loads(meta["detstream.class_names"])[0] == "person"
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("DequantizeLinear") >= 20
    head = [n for n in model.graph.node if n.name.startswith("head/")]
    assert {"Sigmoid", "Exp", "Mul", "Add", "Concat"} <= {n.op_type for n in head}
    head_tensors = {out for n in head for out in n.output}
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert head_tensors and not head_tensors & quantized  # the decode math never goes through 8 bits
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    weights = {init.name for init in model.graph.initializer}
    float_convs = [n.name for n in model.graph.node if n.op_type == "Conv" and n.input[1] in weights]
    assert float_convs == ["L0/conv"]  # the stem (conv, leaky, maxpool on the image) stays fp32, the rest is INT8
    spec = load_model_spec(int8_model)
    assert spec.ort_disabled_optimizers == ("QDQPropagationTransformer",)
    assert (spec.layout, spec.static_batch, spec.input_height, spec.input_width) == ("yolov5", None, 416, 416)
    assert (spec.dynamic_hw, spec.stride) == (True, 32)


def test_the_engine_skips_the_optimizer_the_int8_file_names_and_gets_the_same_values(int8_model, held_out_frames):
    """The file's ``detstream.ort_disabled_optimizers`` reaches the pipeline's engine, and skipping
    QDQ propagation (which only moves a QuantizeLinear across a max-pool) leaves every output as it was."""
    from app.config import EngineConfig
    from app.engines.onnxruntime import OrtEngine

    spec = load_model_spec(int8_model)
    engine = OrtEngine(spec, EngineConfig(backend="onnxruntime", max_batch=2, onnxruntime={"intra_op_threads": 1}))
    assert engine.provider == "CPUExecutionProvider"
    with_pass = ort.InferenceSession(str(int8_model), providers=["CPUExecutionProvider"])  # propagation on
    frames = [np.ascontiguousarray(letterbox(rgb, RECT["vtest"])[0]) for rgb in held_out_frames[:2]]
    try:
        got = engine.submit(frames).wait()[0]
    finally:
        engine.close()
    want = with_pass.run(["output"], {"images": np.stack(frames)})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
