"""ONNX Runtime's CUDA provider on a real GPU: the fallback a GPU machine without TensorRT runs on.

Marked ``gpu``; they skip without a GPU (tests/gpu/conftest.py) and where the
installed onnxruntime has no CUDA provider (the plain ``onnxruntime`` wheel).
The real-model test compares the pipeline's detections from the CUDA provider
with those from the CPU provider: the GPU may use other kernels (TF32
convolutions among them), so boxes are matched by IoU, not compared bit for bit.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.config import EngineConfig
from app.engines import create_engine
from app.engines.onnxruntime import OrtEngine
from app.models.quantization.agreement import CONF_THRESHOLD, NMS_IOU, f1_agreement
from app.models.quantization.calibration import InputFit, decode_frames, evenly_spaced
from app.models.spec import load_model_spec
from app.postprocess.yolo import decode_batch
from app.preprocess import letterbox_into
from app.types import Detections

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engines"))
from engine_models import make_model, random_frames, reference

pytestmark = pytest.mark.gpu

CUDA = "CUDAExecutionProvider"


@pytest.fixture(autouse=True)
def _require_cuda_provider() -> None:
    if CUDA not in ort.get_available_providers():
        pytest.skip(f"needs onnxruntime-gpu: this onnxruntime {ort.__version__} has no {CUDA}")


def _config(**changes: object) -> EngineConfig:
    return EngineConfig(**{"backend": "onnxruntime", "max_batch": 4, **changes})


def test_the_cuda_provider_computes_what_numpy_does(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OrtEngine(spec, _config(precision="fp32"), [CUDA, "CPUExecutionProvider"])  # fp32: exact numbers
    try:
        assert engine.backend == f"onnxruntime:{CUDA}"
        assert engine.batch_sizes == (4,), "every run pads to max_batch: a new shape costs a cuDNN search"
        # More batches than output sets, so that every IO binding is used again with new frames
        # (ONNX Runtime copies a host input to the GPU when it is bound: a reused binding must be bound again).
        for round_ in range(engine.output_sets + 1):
            n = (1, 3, 4)[round_ % 3]
            frames = random_frames(n, seed=10 * round_ + n)
            for got, want in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    finally:
        engine.close()


def test_the_cuda_provider_runs_the_fp16_model_for_fp16_within_fp16_tolerance(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = OrtEngine(spec, _config(precision="fp16", tensorrt={"cache_dir": str(tmp_path / "cache")}),
                       [CUDA, "CPUExecutionProvider"])
    try:
        assert engine.backend == f"onnxruntime:{CUDA}"
        assert list((tmp_path / "cache" / "models").glob("tiny-fp16-*.onnx")), "the fp16 copy was not made"
        frames = random_frames(4, seed=4)
        for got, want in zip(engine.submit(list(frames)).wait(), reference(frames), strict=True):
            np.testing.assert_allclose(got, want, atol=2e-2)
    finally:
        engine.close()


def test_the_cuda_provider_takes_nominal_frames_only(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "dynamic.onnx", None, dynamic_hw=True)
    engine = OrtEngine(spec, _config(), [CUDA, "CPUExecutionProvider"])
    try:
        assert not engine.accepts_dynamic_hw, "a GPU provider runs one shape; rectangles would each be searched"
        with pytest.raises(ValueError):
            engine.submit([np.zeros((3, 4, 8), np.float32)])
    finally:
        engine.close()


def test_auto_without_tensorrt_falls_back_to_the_cuda_provider_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("TensorRT is installed here, so backend auto does not fall back")
    spec = make_model(tmp_path / "tiny.onnx", None)
    with caplog.at_level(logging.WARNING, logger="app.engines"):
        engine = create_engine(spec, _config(backend="auto", tensorrt={"cache_dir": str(tmp_path / "cache")}))
    try:
        # The TensorRT EP comes first in the provider list; without libnvinfer it cannot load, and ONNX Runtime
        # moves on to the CUDA provider, never to the CPU while a GPU is usable.
        assert engine.backend in (f"onnxruntime:{CUDA}", "onnxruntime:TensorrtExecutionProvider")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and warnings[0].startswith("tensorrt unavailable"), warnings
        assert engine.backend in warnings[0]
    finally:
        engine.close()


def _detections(engine: OrtEngine, model: Path, inputs: list[np.ndarray], boxes: list) -> list[Detections]:
    spec = load_model_spec(model)
    found: list[Detections] = []
    for tensor, box in zip(inputs, boxes, strict=True):
        outputs = engine.submit([tensor]).wait()
        found += decode_batch([o.copy() for o in outputs], spec, [box], conf_threshold=CONF_THRESHOLD,
                              iou_threshold=NMS_IOU, class_ids_keep=None, max_detections=300)
    return found


def test_the_default_model_detects_on_the_gpu_what_it_detects_on_the_cpu(default_model: Path,
                                                                         vtest: Path) -> None:
    spec = load_model_spec(default_model)
    fit = InputFit(spec.input_height, spec.input_width, spec.scale)  # nominal frames, as a GPU provider takes them
    inputs, boxes = [], []
    for _, rgb in decode_frames(vtest, evenly_spaced(795, 24)):
        inputs.append(fit.blank(rgb.shape[1], rgb.shape[0]))
        boxes.append(letterbox_into(rgb, inputs[-1], spec.scale))
    on_cpu = OrtEngine(spec, _config(), ["CPUExecutionProvider"])
    on_gpu = OrtEngine(spec, _config(), [CUDA, "CPUExecutionProvider"])
    try:
        assert on_gpu.backend == f"onnxruntime:{CUDA}"
        cpu_found = _detections(on_cpu, default_model, inputs, boxes)
        gpu_found = _detections(on_gpu, default_model, inputs, boxes)
    finally:
        on_cpu.close()
        on_gpu.close()
    assert sum(len(d) for d in cpu_found) >= 24, "the clip has people in every frame"
    agreement = f1_agreement(cpu_found, gpu_found)
    assert agreement.f1 >= 0.98, agreement
