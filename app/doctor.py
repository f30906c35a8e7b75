"""``detstream doctor``: what this machine offers for inference, and what ``engine.backend: auto`` picks and why.

It prints the same :class:`~app.engines.probe.MachineProbe` and :class:`~app.engines.selection.EnginePlan`
that ``create_engine`` uses, so its answer is the pipeline's decision; each missing piece comes with what to
install. It loads no model and always exits 0; ``--json`` prints one object for scripts.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from app.engines.probe import MachineProbe, probe_machine
from app.engines.selection import plan_engines, resolve_precision


def doctor_report(probe: MachineProbe, backend: str = "auto", precision: str = "auto") -> dict[str, Any]:
    """The doctor's findings as plain data (what ``--json`` prints)."""
    plan = plan_engines(backend, probe)
    first = plan.candidates[0]
    chosen = resolve_precision(precision, first, probe)
    cpu = probe.cpu
    return {
        "cpu": {"model": cpu.model, "physical_cores": cpu.cores, "features": list(cpu.feature_names),
                "native_bf16": cpu.native_bf16, "vnni": cpu.vnni, "amx": cpu.amx},
        "gpu": asdict(probe.gpu) | {"present": probe.gpu.present},
        "cuda_runtime": probe.cuda_runtime,
        "cuda_python": asdict(probe.cuda_python),
        "tensorrt": asdict(probe.tensorrt) | {"flavour": probe.tensorrt_flavour},
        "onnxruntime": asdict(probe.onnxruntime) | {"providers": list(probe.ort_providers)},
        "openvino": asdict(probe.openvino) | {"devices": list(probe.openvino_devices)},
        "backend": backend,
        "picks": {"backend": first.backend, "device": first.device, "precision": chosen.value,
                  "engine": f"{first.backend}:{first.device}:{chosen.value}", "label": first.label,
                  "precision_reason": chosen.reason},
        "then": [f"{c.backend}:{c.device}" for c in plan.candidates[1:]],
        "missing": [{"engine": f"{s.candidate.backend}:{s.candidate.device}", "reason": s.reason,
                     "install": s.install} for s in plan.skipped],
    }


def render(report: dict[str, Any]) -> str:
    """The report as a few aligned lines for a person."""
    cpu, gpu, picks = report["cpu"], report["gpu"], report["picks"]
    lines = [
        f"CPU          {cpu['model']}, {cpu['physical_cores']} physical cores; "
        f"{', '.join(cpu['features']) or 'no AVX-512, VNNI or AMX'}",
        f"GPU          {gpu['name']} (driver {gpu['driver']})" if gpu["present"]
        else f"GPU          none: {gpu['reason']}",
        f"CUDA runtime {report['cuda_runtime'] or 'not found'}; cuda-python {_version(report['cuda_python'])}",
        f"TensorRT     {_version(report['tensorrt'])}" + (f" ({report['tensorrt']['flavour']})"
                                                         if report["tensorrt"]["flavour"] else ""),
        f"ONNX Runtime {_version(report['onnxruntime'])}; providers: {', '.join(report['onnxruntime']['providers'])}",
        f"OpenVINO     {_version(report['openvino'])}" + (f"; devices: {', '.join(report['openvino']['devices'])}"
                                                        if report["openvino"]["devices"] else ""),
        "",
        f"engine.backend: {report['backend']} picks {picks['engine']}: {picks['label']}, {picks['precision']} "
        f"({picks['precision_reason']})",
    ]
    if report["then"]:
        lines.append(f"  falls back to: {', '.join(report['then'])}")
    for missing in report["missing"]:
        lines.append(f"  not used: {missing['engine']}: {missing['reason']}; to use it: {missing['install']}")
    return "\n".join(lines)


def _version(package: dict[str, Any]) -> str:
    return package["version"] or package["reason"] or "not installed"


def doctor_command(as_json: bool, backend: str = "auto", precision: str = "auto") -> int:
    """Print the report; exit 0 always (a missing engine is a finding, not an error)."""
    report = doctor_report(probe_machine(), backend, precision)
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
