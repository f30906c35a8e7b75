"""Which engine ``engine.backend`` gets on this machine, and in which precision: a plan made from a probe.

:func:`plan_engines` turns ``engine.backend`` and a :class:`~app.engines.probe.MachineProbe` into an
:class:`EnginePlan`: the candidates to open, in order, and the ones passed over with the reason and what to
install. ``auto`` tries TensorRT on an NVIDIA GPU, then ONNX Runtime's GPU provider there, then OpenVINO on the
CPU, then ONNX Runtime's CPU provider. ``create_engine`` opens the plan's candidates; ``detstream doctor``
prints the same plan.

:func:`resolve_precision` turns ``engine.precision`` into what the chosen engine really runs, with the reason:
``auto`` is fp16 on a GPU, bf16 on a CPU that computes it natively (AVX512_BF16 or AMX), fp32 elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engines.probe import MachineProbe

TENSORRT_INSTALL = "pip install 'detstream[tensorrt]'"
DRIVER_INSTALL = "an NVIDIA GPU with its driver (libcuda.so.1), then pip install 'detstream[tensorrt]'"


@dataclass(frozen=True)
class Candidate:
    """One way to run the model: a registered backend (:data:`app.engines.BACKENDS`) on a device."""

    backend: str
    device: str
    label: str


TENSORRT = Candidate("tensorrt", "GPU", "TensorRT on the NVIDIA GPU")
ORT_GPU = Candidate("onnxruntime", "GPU", "ONNX Runtime's GPU provider")
OPENVINO = Candidate("openvino", "CPU", "OpenVINO on the CPU")
ORT_CPU = Candidate("onnxruntime", "CPU", "ONNX Runtime's CPU provider")

ORDERS: dict[str, tuple[Candidate, ...]] = {
    "auto": (TENSORRT, ORT_GPU, OPENVINO, ORT_CPU),
    "tensorrt": (TENSORRT, ORT_GPU, OPENVINO, ORT_CPU),
    "openvino": (OPENVINO, ORT_CPU),
    "onnxruntime": (ORT_GPU, ORT_CPU),
}
"""``engine.backend`` → the candidates considered, in order (an explicit backend falls back like ``auto``)."""


@dataclass(frozen=True)
class Skipped:
    """A candidate the probe rules out: why, and what would make it available."""

    candidate: Candidate
    reason: str
    install: str


@dataclass(frozen=True)
class EnginePlan:
    """``candidates`` to open in order (the last always runs on the CPU); ``skipped`` were ruled out by the probe."""

    requested: str
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skipped, ...]

    @property
    def requested_skipped(self) -> Skipped | None:
        """Why the explicitly requested backend cannot run, when the probe rules out every device of it (logged
        at WARNING); None for ``auto`` or when the backend runs on some device."""
        if self.requested == "auto" or any(c.backend == self.requested for c in self.candidates):
            return None
        return next((s for s in self.skipped if s.candidate.backend == self.requested), None)

    def why(self) -> str:
        """Why the first candidate: the skipped ones before it, one clause each."""
        first = self.candidates[0]
        before = [s for s in self.skipped if _index(self.requested, s.candidate) < _index(self.requested, first)]
        return "; ".join(f"{s.candidate.backend} ({s.candidate.device}): {s.reason}" for s in before)


def plan_engines(backend: str, probe: MachineProbe) -> EnginePlan:
    """The plan for ``engine.backend`` on the probed machine (see the module docstring)."""
    candidates, skipped = [], []
    for candidate in ORDERS[backend]:
        ruled_out = _rule_out(candidate, probe)
        if ruled_out is None:
            candidates.append(candidate)
        else:
            skipped.append(Skipped(candidate, *ruled_out))
    return EnginePlan(backend, tuple(candidates), tuple(skipped))


def _rule_out(candidate: Candidate, probe: MachineProbe) -> tuple[str, str] | None:
    if candidate.device == "GPU" and not probe.gpu.present:
        return f"no NVIDIA GPU: {probe.gpu.reason}", DRIVER_INSTALL if candidate is TENSORRT else \
            "an NVIDIA GPU with its driver (libcuda.so.1) and pip install onnxruntime-gpu"
    if candidate is TENSORRT and not probe.tensorrt.installed:
        return "TensorRT is not installed", TENSORRT_INSTALL
    if candidate is TENSORRT and probe.tensorrt_flavour == "lean":
        return "only TensorRT's lean runtime is installed (it cannot build engines)", TENSORRT_INSTALL
    if candidate is ORT_GPU and probe.ort_gpu_provider is None:
        return "this ONNX Runtime has no GPU provider", "pip install onnxruntime-gpu (with CUDA 12 libraries)"
    if candidate is OPENVINO and not probe.openvino.installed:
        return f"openvino is {probe.openvino.reason or 'not installed'}", "pip install openvino"
    if candidate is OPENVINO and "CPU" not in probe.openvino_devices:
        return f"OpenVINO lists no CPU device ({probe.openvino.reason or 'devices: none'})", "pip install openvino"
    return None


def _index(backend: str, candidate: Candidate) -> int:
    return ORDERS[backend].index(candidate)


@dataclass(frozen=True)
class Precision:
    """What an engine runs (``value``: fp32, fp16, bf16, int8) and why; ``downgraded`` when it is not what was
    asked for explicitly (logged at WARNING)."""

    value: str
    reason: str
    downgraded: bool = False


def resolve_precision(requested: str, candidate: Candidate, probe: MachineProbe) -> Precision:
    """``engine.precision`` for this candidate on this machine (see the module docstring)."""
    if requested == "int8":
        return Precision("int8", "asked for: the INT8 (Q/DQ) model")
    if candidate.device == "GPU":
        if requested == "auto":
            return Precision("fp16", "auto on a GPU")
        return Precision(requested, "asked for")
    native = probe.cpu.native_bf16
    if candidate is OPENVINO:
        if requested == "auto":
            return (Precision("bf16", f"auto on a CPU with {native}") if native
                    else Precision("fp32", "auto on a CPU without AVX512_BF16 or AMX"))
        if requested == "bf16" and not native:
            return Precision("fp32", "bf16 asked for, but this CPU has neither AVX512_BF16 nor AMX", True)
        if requested == "fp16":
            return Precision("fp32", "fp16 is not a CPU format here", True)
        return Precision(requested, "asked for")
    if requested in ("bf16", "fp16"):
        return Precision("fp32", f"{requested} is not supported on ONNX Runtime's CPU provider", True)
    return Precision("fp32", "ONNX Runtime's CPU provider runs fp32" if requested == "auto" else "asked for")
