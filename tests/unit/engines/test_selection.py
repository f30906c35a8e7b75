"""Engine selection from a described machine: every combination of present and absent engines, the one log line
and its level, and what each precision setting runs."""

from __future__ import annotations

import itertools
import logging
import shutil
from pathlib import Path

import pytest
from engine_models import make_model, random_frames, reference

from app.config import EngineConfig
from app.engines import create_engine
from app.engines.probe import CpuInfo, GpuInfo, MachineProbe, Package, probe_machine
from app.engines.selection import OPENVINO, ORT_CPU, ORT_GPU, TENSORRT, plan_engines, resolve_precision
from app.errors import EngineLoadError
from app.models.spec import load_model_spec

BF16_CPU = CpuInfo("AMD EPYC", 2, frozenset({"avx512f", "avx512_bf16", "avx512_vnni"}))
AMX_CPU = CpuInfo("Intel Xeon", 2, frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
PLAIN_CPU = CpuInfo("old CPU", 2, frozenset({"avx2"}))


def machine(*, gpu: bool = False, trt: str | None = None, ort_gpu: bool = False, openvino: bool = False,
            cpu: CpuInfo = BF16_CPU) -> MachineProbe:
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider") if ort_gpu else ("CPUExecutionProvider",)
    return MachineProbe(
        cpu=cpu, gpu=GpuInfo("Fake GPU", "580.0", 1) if gpu else GpuInfo(reason="no NVIDIA driver"),
        tensorrt=Package("11.4") if trt else Package(reason="not installed"), tensorrt_flavour=trt,
        ort_providers=providers, openvino=Package("2026.4.1") if openvino else Package(reason="not installed"),
        openvino_devices=("CPU",) if openvino else ())


def expected_first(gpu: bool, trt: str | None, ort_gpu: bool, openvino: bool) -> object:
    if gpu and trt == "full":
        return TENSORRT
    if gpu and ort_gpu:
        return ORT_GPU
    return OPENVINO if openvino else ORT_CPU


@pytest.mark.parametrize(("gpu", "trt", "ort_gpu", "openvino"),
                         list(itertools.product([False, True], [None, "lean", "full"], [False, True], [False, True])))
def test_auto_picks_the_fastest_engine_present_for_every_combination(gpu: bool, trt: str | None, ort_gpu: bool,
                                                                     openvino: bool) -> None:
    plan = plan_engines("auto", machine(gpu=gpu, trt=trt, ort_gpu=ort_gpu, openvino=openvino))
    assert plan.candidates[0] == expected_first(gpu, trt, ort_gpu, openvino)
    assert plan.candidates[-1] == ORT_CPU  # the CPU provider is always there to fall back on
    assert len(plan.candidates) + len(plan.skipped) == 4
    assert plan.requested_skipped is None  # auto asked for nothing in particular


def test_every_skipped_engine_says_what_to_install() -> None:
    plan = plan_engines("auto", machine())
    installs = {s.candidate: s.install for s in plan.skipped}
    assert "pip install 'detstream[tensorrt]'" in installs[TENSORRT] and "NVIDIA" in installs[TENSORRT]
    assert installs[OPENVINO] == "pip install openvino"
    assert "no NVIDIA GPU" in plan.why() and "openvino is not installed" in plan.why()


def test_an_explicit_backend_that_cannot_run_is_named() -> None:
    assert plan_engines("openvino", machine()).requested_skipped is not None
    assert plan_engines("tensorrt", machine(openvino=True)).candidates[0] == OPENVINO
    assert plan_engines("tensorrt", machine(openvino=True)).requested_skipped is not None
    assert plan_engines("onnxruntime", machine(openvino=True)).candidates == (ORT_CPU,)
    assert plan_engines("onnxruntime", machine(openvino=True)).requested_skipped is None  # the CPU provider runs


@pytest.mark.parametrize(("requested", "candidate", "cpu", "value", "downgraded"), [
    ("auto", TENSORRT, BF16_CPU, "fp16", False),
    ("auto", OPENVINO, BF16_CPU, "bf16", False),
    ("auto", OPENVINO, AMX_CPU, "bf16", False),
    ("auto", OPENVINO, PLAIN_CPU, "fp32", False),
    ("bf16", OPENVINO, PLAIN_CPU, "fp32", True),
    ("fp32", OPENVINO, BF16_CPU, "fp32", False),
    ("int8", OPENVINO, BF16_CPU, "int8", False),
    ("auto", ORT_CPU, BF16_CPU, "fp32", False),
    ("bf16", ORT_CPU, BF16_CPU, "fp32", True),
    ("fp16", ORT_CPU, BF16_CPU, "fp32", True),
    ("int8", ORT_CPU, PLAIN_CPU, "int8", False),
])
def test_precision_is_what_the_engine_really_runs(requested: str, candidate: object, cpu: CpuInfo, value: str,
                                                  downgraded: bool) -> None:
    precision = resolve_precision(requested, candidate, machine(cpu=cpu))  # type: ignore[arg-type]
    assert (precision.value, precision.downgraded) == (value, downgraded)


def test_auto_names_which_cpu_feature_computes_bf16() -> None:
    assert "AMX" in resolve_precision("auto", OPENVINO, machine(cpu=AMX_CPU)).reason
    assert "AVX512_BF16" in resolve_precision("auto", OPENVINO, machine(cpu=BF16_CPU)).reason


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "app.engines" and r.levelno == level]


def test_without_openvino_everything_runs_on_onnxruntime_and_says_so_once_at_info(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    with caplog.at_level(logging.INFO, logger="app.engines"):
        engine = create_engine(spec, EngineConfig(max_batch=4), probe=machine(openvino=False))
    try:
        assert engine.backend == "onnxruntime:CPUExecutionProvider:fp32"
        frames = random_frames(2)
        assert abs(engine.submit(list(frames)).wait()[0] - reference(frames)[0]).max() < 1e-5
        assert _lines(caplog, logging.WARNING) == []
        (picked,) = [line for line in _lines(caplog, logging.INFO) if "picked" in line]
        assert "openvino is not installed" in picked and "no NVIDIA GPU" in picked
    finally:
        engine.close()


def test_an_explicit_openvino_request_without_openvino_warns_once(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    engine = create_engine(spec, EngineConfig(backend="openvino", precision="bf16"), probe=machine(openvino=False))
    try:
        assert engine.backend == "onnxruntime:CPUExecutionProvider:fp32"
        warnings = _lines(caplog, logging.WARNING)
        assert len(warnings) == 2, warnings  # the backend, and the precision ONNX Runtime's CPU provider cannot run
        assert warnings[0] == "engine.precision: bf16 is not supported on ONNX Runtime's CPU provider; running fp32"
        assert warnings[1].startswith("openvino requested but unavailable: openvino is not installed")
        assert warnings[1].endswith("; using onnxruntime:CPUExecutionProvider:fp32")
    finally:
        engine.close()


def test_int8_without_the_quantized_model_is_refused_naming_the_command(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    with pytest.raises(EngineLoadError, match=r"tiny-int8\.onnx, which does not exist: make it with `detstream "
                                              r"quantize"):
        create_engine(spec, EngineConfig(precision="int8"), probe=machine(openvino=False))


def test_the_real_probe_of_this_machine_is_quick_and_typed() -> None:
    probe = probe_machine()
    assert probe.cpu.cores >= 1 and probe.onnxruntime.installed
    assert "CPUExecutionProvider" in probe.ort_providers
    assert plan_engines("auto", probe).candidates[-1] == ORT_CPU


@pytest.mark.parametrize("openvino", [False, True])
def test_int8_loads_the_quantized_model_beside_the_fp32_one(tmp_path: Path, default_model: Path,
                                                            openvino: bool) -> None:
    fp32 = tmp_path / "yolov3-tiny.onnx"
    shutil.copyfile(default_model, fp32)
    shutil.copyfile(default_model, tmp_path / "yolov3-tiny-int8.onnx")  # stands in for what `detstream quantize` makes
    spec = load_model_spec(fp32)
    engine = create_engine(spec, EngineConfig(precision="int8", max_batch=2), probe=machine(openvino=openvino))
    try:
        assert engine.spec.path == str(tmp_path / "yolov3-tiny-int8.onnx") and engine.spec.name == spec.name
        assert engine.backend == ("openvino:CPU:int8" if openvino else "onnxruntime:CPUExecutionProvider:int8")
    finally:
        engine.close()
