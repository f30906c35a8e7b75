"""Inference engines: the backend registry and the one place that chooses between backends.

Each backend is a package behind the :class:`~app.engines.base.Engine` interface
(:mod:`app.engines.tensorrt`, :mod:`app.engines.onnxruntime`, :mod:`app.engines.openvino`), registered in
:data:`BACKENDS` under the name ``engine.backend`` and its settings section use (``engine.tensorrt``,
``engine.onnxruntime``, ``engine.openvino``). No backend imports another; what they share lives beside them
(:mod:`app.engines.base`, :mod:`app.engines.shapes`, :mod:`app.engines.cuda`,
:mod:`app.engines.frame_workers`).

``create_engine`` asks :func:`~app.engines.probe.probe_machine` what this machine offers, makes the plan for
``engine.backend`` (:func:`~app.engines.selection.plan_engines`: ``auto`` is TensorRT on an NVIDIA GPU, else
ONNX Runtime's GPU provider there, else OpenVINO on the CPU, else ONNX Runtime's CPU provider) and opens the
plan's candidates in order, each in the precision :func:`~app.engines.selection.resolve_precision` gives it.
One log line says what runs and why:

* INFO when the plan only passed over what the machine lacks (no GPU), e.g.::

    engine: auto picked openvino:CPU:bf16 for yolov3-tiny (auto on a CPU with AVX512_BF16); passed over
    tensorrt (GPU): no NVIDIA GPU: ...; onnxruntime (GPU): no NVIDIA GPU: ...

* WARNING when a candidate that should have run failed (``tensorrt unavailable: <reason>; using <engine>``),
  or when an explicit ``engine.backend`` cannot run (``openvino requested but unavailable: ...; using ...``).

The result messages name the engine really used in their ``engine`` field (``backend:device:precision``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from app.config import EngineConfig
from app.engines.base import Engine, InferenceHandle
from app.engines.cuda.device import CudaDevice, Device
from app.engines.model_files import PrecisionUnavailable, model_for
from app.engines.onnxruntime import CPU, OrtEngine
from app.engines.openvino import OvEngine
from app.engines.probe import MachineProbe, probe_machine
from app.engines.selection import ORDERS, Candidate, EnginePlan, Precision, plan_engines, resolve_precision
from app.engines.tensorrt import open_tensorrt_engine
from app.engines.tensorrt.adapter import RealTrtRuntime
from app.engines.tensorrt.runtime import TrtRuntime
from app.errors import EngineError, EngineLoadError
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DeviceFactory = Callable[[], Device]
TrtFactory = Callable[[], TrtRuntime]

__all__ = ["BACKENDS", "PLANS", "Engine", "InferenceHandle", "MachineProbe", "create_engine", "detect_cuda",
           "probe_machine"]


@dataclass(frozen=True)
class Factories:
    """How a backend reaches the machine: tests pass a host device and a fake TensorRT."""

    device: DeviceFactory
    trt: TrtFactory


def create_engine(
    spec: ModelSpec,
    config: EngineConfig,
    *,
    device_factory: DeviceFactory | None = None,
    trt_factory: TrtFactory | None = None,
    probe: MachineProbe | None = None,
) -> Engine:
    """The engine for ``spec`` as ``config.backend`` asks on this machine (see the module docstring).

    Every engine returned has run its warm-up (:meth:`Engine.warmup`), so that the first frames are not slow.
    ``device_factory`` and ``trt_factory`` replace :meth:`CudaDevice.open` and :meth:`RealTrtRuntime.load`;
    ``probe`` replaces :func:`probe_machine` (tests describe a machine instead of patching imports).
    Raises :class:`EngineLoadError` when no candidate of the plan can load the model, or at once when
    ``engine.precision: int8`` asks for an INT8 model that does not exist.
    """
    factories = Factories(device_factory or CudaDevice.open, trt_factory or RealTrtRuntime.load)
    probe = probe or probe_machine()
    plan = plan_engines(config.backend, probe)
    failures: list[tuple[Candidate, str]] = []
    for candidate in plan.candidates:
        precision = resolve_precision(config.precision, candidate, probe)
        try:
            model = spec if candidate.backend == "tensorrt" else model_for(spec, precision.value)
            engine = BACKENDS[candidate.backend](model, config, factories, candidate, precision.value)
        except PrecisionUnavailable:
            raise
        except Exception as error:  # any failure of a candidate means the next one; logged below
            if candidate == plan.candidates[-1]:
                reasons = "; ".join(f"{c.backend}: {r}" for c, r in failures)
                if not failures:
                    raise
                raise EngineLoadError(f"no inference backend for {spec.path}: {reasons}; {_one_line(error)}") from None
            failures.append((candidate, _one_line(error)))
            continue
        _log_choice(plan, failures, engine, precision, spec)
        return engine
    raise AssertionError("the last candidate always runs on the CPU")


def _log_choice(plan: EnginePlan, failures: list[tuple[Candidate, str]], engine: Engine, precision: Precision,
                spec: ModelSpec) -> None:
    """One line: INFO when the plan simply went past what this machine lacks, WARNING when what was asked for
    (an explicit backend or precision) or what should have worked (a failed candidate) does not run."""
    if precision.downgraded:
        logger.warning("engine.precision: %s; running %s", precision.reason, precision.value)
    skipped = plan.requested_skipped
    if failures:
        first, reason = failures[0]
        prefix = f"{first.backend} requested but unavailable" if plan.requested == first.backend else \
            f"{first.backend} unavailable"
        logger.warning("%s: %s; using %s", prefix, reason, engine.backend)
    elif skipped is not None:
        logger.warning("%s requested but unavailable: %s (%s); using %s", plan.requested, skipped.reason,
                       skipped.install, engine.backend)
    else:
        why = plan.why()
        logger.info("engine: %s picked %s for %s (%s)%s", plan.requested, engine.backend, spec.name,
                    precision.reason, f"; passed over {why}" if why else "")


def _onnxruntime(spec: ModelSpec, config: EngineConfig, _factories: Factories, candidate: Candidate,
                 precision: str) -> Engine:
    """ONNX Runtime, warmed up: on the CUDA provider the first run of a shape searches cuDNN's convolution
    algorithms for long enough that live cameras would drop frames if the first real batch paid for it."""
    providers = [CPU] if candidate.device == "CPU" else None
    engine = OrtEngine(spec, config, providers, precision=precision)
    return _warmed_up(engine, time.monotonic(), "warmed up")


def _tensorrt(spec: ModelSpec, config: EngineConfig, factories: Factories, _candidate: Candidate,
              precision: str) -> Engine:
    """TensorRT on a device of its own (closed with the engine); warmed up by :func:`open_tensorrt_engine`.
    It reads ``engine.precision`` resolved (``auto`` is fp16 on a GPU; bf16 runs as fp16 there)."""
    config = config.model_copy(update={"precision": "fp16" if precision == "bf16" else precision})
    runtime = factories.trt()
    device = factories.device()
    try:
        engine = open_tensorrt_engine(spec, config, device, runtime, config.tensorrt.engine_cache_dir)
    except BaseException:
        device.close()
        raise
    engine.owns_device = True
    return engine


def _openvino(spec: ModelSpec, config: EngineConfig, _factories: Factories, _candidate: Candidate,
              precision: str) -> Engine:
    """OpenVINO on the CPU, compiled (or loaded from its cache) and warmed up."""
    settings = config.openvino
    t0 = time.monotonic()
    engine = OvEngine(spec, precision, requests=settings.requests, device=settings.device, threads=settings.threads,
                      max_batch=config.max_batch)
    return _warmed_up(engine, t0, "ready")


def _warmed_up(engine: Engine, t0: float, done: str) -> Engine:
    """``engine`` after its warm-up run, logged as ``<backend> <done> in <s since t0>``. A warm-up that fails
    means the model cannot run here: the engine is closed and :class:`EngineLoadError` raised."""
    try:
        engine.warmup()
    except EngineError as error:
        engine.close()
        raise EngineLoadError(f"{engine.backend}: the warm-up run on {engine.spec.path} failed: {error}") from None
    logger.info("engine: %s %s in %.2f s", engine.backend, done, time.monotonic() - t0)
    return engine


Opener = Callable[[ModelSpec, EngineConfig, Factories, Candidate, str], Engine]

BACKENDS: Mapping[str, Opener] = MappingProxyType({
    "tensorrt": _tensorrt,
    "onnxruntime": _onnxruntime,
    "openvino": _openvino,
})
"""Backend name → a function that opens it on a candidate's device in a resolved precision, warmed up; raises
when the backend cannot run here."""

PLANS: Mapping[str, tuple[Candidate, ...]] = MappingProxyType(ORDERS)
"""``engine.backend`` → the candidates considered, in order (:data:`app.engines.selection.ORDERS`); the probe
rules some out (:func:`app.engines.selection.plan_engines`), the first that opens is used."""


def detect_cuda() -> str | None:
    """None when a CUDA GPU is usable through cuda-python here, else the reason (for the CLI and README)."""
    try:
        device = CudaDevice.open()
    except EngineError as error:
        return str(error)
    device.close()
    return None


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(error, EngineError):
        return message or type(error).__name__
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
