"""What this machine offers for inference, in one typed snapshot: :class:`MachineProbe`.

Engine selection (:mod:`app.engines.selection`) and ``detstream doctor`` (:mod:`app.doctor`) read the same
probe, so the doctor's answer is the decision ``create_engine`` makes. :func:`probe_machine` looks without
loading a model and without touching a GPU beyond the driver's device query; it takes well under a second
on a machine without a GPU. Tests build a :class:`MachineProbe` by hand instead of patching imports.

Nothing here imports TensorRT itself (importing the full library without a GPU can abort): its version and
flavour come from the installed distributions' metadata.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from app.engines.onnxruntime.session import physical_cores

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@dataclass(frozen=True)
class Package:
    """An optional Python package: its version when installed, else why it is not usable (``reason``)."""

    version: str | None = None
    reason: str = ""

    @property
    def installed(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class GpuInfo:
    """The first NVIDIA GPU, seen through the driver; ``name`` is None when there is none (``reason`` says why)."""

    name: str | None = None
    driver: str | None = None
    count: int = 0
    reason: str = ""

    @property
    def present(self) -> bool:
        return self.name is not None


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's model name, physical cores and the instruction-set flags that decide CPU precision."""

    model: str = "unknown CPU"
    cores: int = 1
    flags: frozenset[str] = frozenset()

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def vnni(self) -> str | None:
        """``AVX512_VNNI`` or ``AVX_VNNI`` (int8 dot products), the first found, else None."""
        return "AVX512_VNNI" if "avx512_vnni" in self.flags else "AVX_VNNI" if "avx_vnni" in self.flags else None

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags or "amx_tile" in self.flags

    @property
    def native_bf16(self) -> str | None:
        """What computes bf16 natively here: ``AMX`` or ``AVX512_BF16``; None when neither does (fp32 then)."""
        if "amx_bf16" in self.flags:
            return "AMX"
        return "AVX512_BF16" if "avx512_bf16" in self.flags else None

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = ["AVX-512"] if self.avx512 else []
        names += ["AVX512_BF16"] if "avx512_bf16" in self.flags else []
        names += [v for v in ("AVX512_VNNI", "AVX_VNNI") if v.lower() in self.flags]
        names += ["AMX"] if self.amx else []
        return tuple(names)


@dataclass(frozen=True)
class MachineProbe:
    """Everything engine selection and ``detstream doctor`` need to know about this machine."""

    cpu: CpuInfo = field(default_factory=CpuInfo)
    gpu: GpuInfo = field(default_factory=lambda: GpuInfo(reason="no NVIDIA driver (libcuda.so.1 not found)"))
    cuda_runtime: str | None = None
    cuda_python: Package = field(default_factory=lambda: Package(reason="not installed"))
    tensorrt: Package = field(default_factory=lambda: Package(reason="not installed"))
    tensorrt_flavour: str | None = None
    """``full`` (can build engines) or ``lean`` (runs prebuilt engines only); None when not installed."""
    onnxruntime: Package = field(default_factory=lambda: Package("unknown"))
    ort_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    openvino: Package = field(default_factory=lambda: Package(reason="not installed"))
    openvino_devices: tuple[str, ...] = ()

    @property
    def ort_gpu_provider(self) -> str | None:
        """The first ONNX Runtime GPU provider this build offers, or None."""
        return next((p for p in GPU_PROVIDERS if p in self.ort_providers), None)

    @property
    def openvino_cpu(self) -> bool:
        return self.openvino.installed and "CPU" in self.openvino_devices


def probe_machine() -> MachineProbe:
    """Look at this machine now (see the module docstring)."""
    tensorrt, flavour = _tensorrt()
    ort, providers = _onnxruntime()
    openvino, devices = _openvino()
    return MachineProbe(cpu=_cpu(), gpu=_gpu(), cuda_runtime=_cuda_runtime(), cuda_python=_distribution(
        "cuda-python", "cuda-bindings"), tensorrt=tensorrt, tensorrt_flavour=flavour, onnxruntime=ort,
        ort_providers=providers, openvino=openvino, openvino_devices=devices)


def _cpu() -> CpuInfo:
    model, flags = "unknown CPU", frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model, physical_cores(), flags)


def _distribution(*names: str) -> Package:
    for name in names:
        try:
            return Package(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return Package(reason="not installed")


def _gpu() -> GpuInfo:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return GpuInfo(reason="no NVIDIA driver (libcuda.so.1 not found)")
    try:
        from cuda.bindings import driver
    except ImportError:
        return GpuInfo(reason="the NVIDIA driver is present but cuda-python is not installed, so the GPU was not "
                       "queried")
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return GpuInfo(reason=f"cuInit failed ({err})")
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0 or count == 0:
            return GpuInfo(reason="the NVIDIA driver reports no GPU")
        err, version = driver.cuDriverGetVersion()
        driver_version = f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 else None
        err, device = driver.cuDeviceGet(0)
        err, raw = driver.cuDeviceGetName(64, device)
        name = raw.split(b"\0", 1)[0].decode(errors="replace") if int(err) == 0 else "NVIDIA GPU"
    except Exception as error:  # any driver failure means: no usable GPU, and why
        return GpuInfo(reason=f"the GPU query failed: {type(error).__name__}: {error}")
    return GpuInfo(name=name, driver=driver_version, count=count)


def _cuda_runtime() -> str | None:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    try:
        err, version = runtime.cudaRuntimeGetVersion()
    except Exception:  # a broken install: reported as absent
        return None
    return f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 else None


def _tensorrt() -> tuple[Package, str | None]:
    full = _distribution("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu13-bindings",
                         "tensorrt-cu12-bindings")
    if full.installed and importlib.util.find_spec("tensorrt") is not None:
        return full, "full"
    lean = _distribution("tensorrt-lean", "tensorrt-lean-cu13-bindings", "tensorrt-lean-cu12-bindings")
    if lean.installed:
        return lean, "lean"
    return Package(reason="not installed"), None


def _onnxruntime() -> tuple[Package, tuple[str, ...]]:
    try:
        import onnxruntime as ort
    except ImportError as error:
        return Package(reason=f"cannot import onnxruntime: {error}"), ()
    return Package(ort.__version__), tuple(ort.get_available_providers())


def _openvino() -> tuple[Package, tuple[str, ...]]:
    try:
        import openvino as ov
    except ImportError:
        return Package(reason="not installed"), ()
    try:
        devices = tuple(ov.Core().available_devices)
    except Exception as error:  # a broken install is reported, not raised
        return Package(ov.get_version(), reason=f"OpenVINO cannot list devices: {error}"), ()
    return Package(ov.get_version().split("-")[0]), devices
