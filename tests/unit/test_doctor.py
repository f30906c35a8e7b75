"""``detstream doctor`` on described machines: the plan create_engine makes, and what to install."""

from __future__ import annotations

from app.doctor import doctor_report, render
from app.engines.probe import CpuInfo, GpuInfo, MachineProbe, Package

CPU = CpuInfo("Intel Xeon", 4, frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni"}))


def test_a_cpu_machine_with_openvino_picks_it_in_bf16_and_says_which_feature() -> None:
    report = doctor_report(MachineProbe(cpu=CPU, openvino=Package("2026.4.1"), openvino_devices=("CPU",)))
    assert report["picks"]["engine"] == "openvino:CPU:bf16" and "AMX" in report["picks"]["precision_reason"]
    assert report["then"] == ["onnxruntime:CPU"]
    assert {m["engine"] for m in report["missing"]} == {"tensorrt:GPU", "onnxruntime:GPU"}
    text = render(report)
    assert "AMX" in text and "pip install 'detstream[tensorrt]'" in text


def test_without_openvino_it_picks_onnxruntime_and_names_the_install() -> None:
    report = doctor_report(MachineProbe(cpu=CpuInfo()))
    assert report["picks"]["engine"] == "onnxruntime:CPU:fp32"
    assert any(m["install"] == "pip install openvino" for m in report["missing"])


def test_a_gpu_machine_with_tensorrt_picks_it_in_fp16() -> None:
    probe = MachineProbe(gpu=GpuInfo("NVIDIA H100", "580.65", 1), tensorrt=Package("11.4"), tensorrt_flavour="full")
    report = doctor_report(probe)
    assert report["picks"]["engine"] == "tensorrt:GPU:fp16" and report["missing"][0]["engine"] == "onnxruntime:GPU"
    assert "NVIDIA H100 (driver 580.65)" in render(report)
