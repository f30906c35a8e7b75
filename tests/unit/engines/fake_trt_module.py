"""A stand-in for the ``tensorrt`` module with the TensorRT ≥ 10 names the adapters call.

Only what :mod:`app.engines.tensorrt.runtime` and :mod:`app.engines.tensorrt.build` use
is here, with the shapes those names have in the real bindings (checked
against the 10.13 and 11.4 wheels). It records what was called, so tests can
check the adapters' logic (profiles per context, flags, timing cache, error
mapping) without TensorRT. It says nothing about TensorRT's own behaviour.
"""

from __future__ import annotations

import enum
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np


class Severity(enum.Enum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class ILogger:
    Severity = Severity

    def __init__(self) -> None:
        pass


class IProgressMonitor:
    def __init__(self) -> None:
        pass


class IInt8EntropyCalibrator2:
    def __init__(self) -> None:
        pass


def make_module(*, version: str = "10.13.3", input_shape: tuple[int, ...] = (-1, 3, 8, 8),
                parse_ok: bool = True, build_ok: bool = True, with_int8: bool = True,
                timing_cache_matches: bool = True) -> SimpleNamespace:
    """A fresh fake module; ``module.calls`` lists what the code under test did."""
    calls: list[tuple] = []

    class Network:
        def get_input(self, index: int) -> SimpleNamespace:
            return SimpleNamespace(shape=input_shape)

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name: str, low: tuple, opt: tuple, high: tuple) -> None:
            self.shapes[name] = (low, opt, high)

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def serialize(self) -> bytes:
            return b"timing:" + self.data

    class Config:
        def __init__(self) -> None:
            self.profiles: list[Profile] = []
            self.flags: list[str] = []
            self.timing: TimingCache | None = None
            self.progress_monitor = None
            self.int8_calibrator = None

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            calls.append(("pool", pool, size))

        def set_flag(self, flag: str) -> None:
            self.flags.append(flag)

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, data: bytes) -> TimingCache:
            return TimingCache(data)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            if cache.data and not timing_cache_matches:
                return False
            self.timing = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            return self.timing

        def set_calibration_profile(self, profile: Profile) -> None:
            calls.append(("calibration_profile", profile.shapes))

    class HostMemory(bytes):
        @property
        def nbytes(self) -> int:
            return len(self)

    class Builder:
        def __init__(self, logger: ILogger) -> None:
            self.logger = logger

        def create_network(self, flags: int) -> Network:
            calls.append(("create_network", flags))
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> HostMemory | None:
            calls.append(("build", config))
            return HostMemory(b"plan") if build_ok else None

    class OnnxParser:
        def __init__(self, network: Network, logger: ILogger) -> None:
            self.num_errors = 0 if parse_ok else 2

        def parse_from_file(self, path: str) -> bool:
            calls.append(("parse", Path(path).name))
            return parse_ok

        def get_error(self, index: int) -> str:
            return f"In node {index} (importTopK): UNSUPPORTED_NODE"

    class Context:
        def __init__(self) -> None:
            self.ok = True

        def set_optimization_profile_async(self, index: int, stream: int) -> bool:
            calls.append(("profile", index, stream))
            return self.ok

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            calls.append(("shape", name, tuple(shape)))
            return self.ok

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            calls.append(("address", name, ptr))
            return self.ok

        def execute_async_v3(self, stream: int) -> bool:
            calls.append(("execute", stream))
            return self.ok

    class CudaEngine:
        names = ("images", "pooled")
        shapes: ClassVar[dict[str, tuple]] = {"images": (-1, 3, 8, 8), "pooled": (-1, 3)}
        num_io_tensors = 2
        num_optimization_profiles = 2

        def get_tensor_name(self, index: int) -> str:
            return self.names[index]

        def get_tensor_mode(self, name: str) -> TensorIOMode:
            return TensorIOMode.INPUT if name == "images" else TensorIOMode.OUTPUT

        def get_tensor_shape(self, name: str) -> tuple:
            return self.shapes[name]

        def get_tensor_dtype(self, name: str) -> str:
            return "float32"

        def get_tensor_profile_shape(self, name: str, index: int) -> list[tuple]:
            return [(1, 3, 8, 8), (4, 3, 8, 8), (4, 3, 8, 8)]

        def create_execution_context(self) -> Context | None:
            return Context()

    class Runtime:
        def __init__(self, logger: ILogger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, blob: bytes) -> CudaEngine | None:
            return CudaEngine() if blob == b"plan" else None

    module = SimpleNamespace(
        __version__=version, calls=calls, ILogger=ILogger, IProgressMonitor=IProgressMonitor,
        TensorIOMode=TensorIOMode, Runtime=Runtime, Builder=Builder, OnnxParser=OnnxParser,
        MemoryPoolType=SimpleNamespace(WORKSPACE="workspace"),
        BuilderFlag=SimpleNamespace(FP16="fp16", INT8="int8"),
        nptype=lambda dtype: np.dtype(dtype).type,
    )
    if with_int8:
        module.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return module
