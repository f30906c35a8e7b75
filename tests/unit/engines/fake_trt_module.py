"""A stand-in for the ``tensorrt`` module with the TensorRT 10/11 names the adapters call.

Only what :mod:`app.engines.tensorrt.adapter` and :mod:`app.engines.tensorrt.build` use
is here, with the names, keywords and behaviour those have in the real bindings
(tests/conformance checks every name here against the real 10.x and 11.x wheels):
``make_module(version="11.x")`` has no ``BuilderFlag.FP16``/``INT8`` and no
implicit calibrator, as TensorRT 11 has none; ``set_optimization_profile_async``
raises ``RuntimeError`` on failure and returns True otherwise;
``add_optimization_profile`` returns -1 for a profile that does not fit the
network input (a batch range on a fixed batch dim); a corrupt timing cache
raises and a foreign one is refused by ``set_timing_cache``. It records what
was called, so tests can check the adapters' logic without TensorRT.
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


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 5


def make_module(*, version: str = "11.4.0", input_shape: tuple[int, ...] = (-1, 3, 8, 8),
                parse_ok: bool = True, build_ok: bool = True,
                timing_cache: str = "matches") -> SimpleNamespace:
    """A fresh fake module; ``module.calls`` lists what the code under test did.

    ``timing_cache`` says what a non-empty timing cache is: ``matches``, ``foreign`` (another GPU or
    TensorRT: ``set_timing_cache`` refuses it) or ``corrupt`` (``create_timing_cache`` raises).
    """
    calls: list[tuple] = []
    major = int(version.split(".")[0])

    class Network:
        def get_input(self, index: int) -> SimpleNamespace:
            return SimpleNamespace(shape=input_shape)

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, input: str, min: tuple, opt: tuple, max: tuple) -> None:  # the real names
            self.shapes[input] = (min, opt, max)

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

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            calls.append(("pool", pool, size))

        def set_flag(self, flag: str) -> None:
            self.flags.append(flag)

        def add_optimization_profile(self, profile: Profile) -> int:
            for low, opt, high in profile.shapes.values():
                for dim, (a, b, c) in zip(input_shape, zip(low, opt, high, strict=True), strict=True):
                    if (dim > 0 and not a == b == c == dim) or not a <= b <= c:
                        return -1  # TensorRT logs an error and returns -1 for an invalid profile
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, serialized_timing_cache: bytes) -> TimingCache:
            if serialized_timing_cache and timing_cache == "corrupt":
                raise RuntimeError("ITimingCache: invalid serialized timing cache")
            return TimingCache(bytes(serialized_timing_cache))

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            if cache.data and timing_cache == "foreign":
                return False
            self.timing = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            return self.timing

    class HostMemory(bytes):
        @property
        def nbytes(self) -> int:
            return len(self)

    class Builder:
        def __init__(self, logger: ILogger) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> Network:
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

        def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
            calls.append(("profile", profile_index, stream_handle))
            if not self.ok:  # the real bindings raise instead of returning False
                raise RuntimeError(f"setOptimizationProfileAsync({profile_index}) failed")
            return True

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            calls.append(("shape", name, tuple(shape)))
            return self.ok

        def set_tensor_address(self, name: str, memory: int) -> bool:
            calls.append(("address", name, memory))
            return self.ok

        def execute_async_v3(self, stream_handle: int) -> bool:
            calls.append(("execute", stream_handle))
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

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple]:
            return [(1, 3, 8, 8), (4, 3, 8, 8), (4, 3, 8, 8)]

        def create_execution_context(self, strategy: object = None) -> Context | None:
            return Context()

    class Runtime:
        def __init__(self, logger: ILogger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> CudaEngine | None:
            return CudaEngine() if serialized_engine == b"plan" else None

    flags = SimpleNamespace(TF32="tf32") if major >= 11 else SimpleNamespace(FP16="fp16", INT8="int8", TF32="tf32")
    return SimpleNamespace(
        __version__=version, calls=calls, ILogger=ILogger, IProgressMonitor=IProgressMonitor,
        TensorIOMode=TensorIOMode, Runtime=Runtime, Builder=Builder, OnnxParser=OnnxParser,
        MemoryPoolType=SimpleNamespace(WORKSPACE="workspace"),
        NetworkDefinitionCreationFlag=NetworkDefinitionCreationFlag,
        BuilderFlag=flags,
        nptype=lambda dtype: np.dtype(dtype).type,
    )
