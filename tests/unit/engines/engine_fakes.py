"""A host fake of TensorRT behind the :mod:`app.engines.tensorrt.runtime` seam.

The fake "builds" an engine description from the real ONNX file (input name,
size, static or dynamic batch, the profile sets) and its execution context
"runs" by queuing a host function on a :class:`HostDevice` stream that
computes :func:`engine_models.reference` from the device input memory into
the device output memory. So results are checkable, copies and graph replay
are real, and a slow context (``exec_delay_s``) shows overlap between streams.

``fail_at`` names the step that raises: ``build``, ``deserialize``, ``context``.

The context refuses what TensorRT refuses: a tensor address that is not
256-byte aligned, a dynamic-shape profile that another live context already
uses, an input shape outside the active profile, an enqueue during stream
capture of a shape that never ran plainly first (TensorRT's first run does
set-up that cannot be captured), and any enqueue while a CUDA error is
pending (TensorRT reports a leftover ``cudaGetLastError`` as its own failure).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from engine_models import reference
from host_device import HostDevice, HostStream

from app.engines.tensorrt.runtime import BuildOptions, TensorInfo
from app.errors import EngineError

TENSOR_ALIGNMENT = 256


@dataclass
class Concurrency:
    """How many fake executions run at once, and the most seen."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0
    peak: int = 0
    executed: int = 0

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1
            self.executed += 1


class FakeTrtRuntime:
    """The :class:`TrtRuntime` seam on the host; counts builds and deserializations."""

    version = "10.99.0-fake"

    def __init__(self, device: HostDevice, *, fail_at: str | None = None, exec_delay_s: float = 0.0,
                 reverse_outputs: bool = False, extra_input: str | None = None) -> None:
        self.device = device
        self.fail_at = fail_at
        self.exec_delay_s = exec_delay_s
        self.reverse_outputs = reverse_outputs  # list the engine's outputs in the other order, as engines may
        self.extra_input = extra_input  # a second engine input the pipeline knows nothing of
        self.concurrency = Concurrency()
        self.builds = 0
        self.built_from: list[Path] = []
        self.deserialized: list[bytes] = []
        self.models: list[FakeModel] = []

    def build(self, onnx_path: Path, options: BuildOptions) -> bytes:
        self.builds += 1
        self.built_from.append(Path(onnx_path))
        if self.fail_at == "build":
            raise EngineError("fake tensorrt: unsupported layer NonMaxSuppression")
        model = onnx.load(str(onnx_path))
        dims = model.graph.input[0].type.tensor_type.shape.dim
        static = dims[0].dim_value if dims[0].HasField("dim_value") else None
        dynamic_hw = not (dims[2].HasField("dim_value") and dims[3].HasField("dim_value"))
        h, w = options.input_hw
        if static and not dynamic_hw:
            profiles = []  # fully static: no profiles (one implicit profile)
        else:  # like build.add_profiles: a fixed batch gets min = opt = max
            ranges = [(static, static, static)] if static else options.profiles
            profiles = [list(p) for _ in range(options.contexts) for p in ranges]
        return json.dumps({"input": options.input_name, "hw": [h, w], "static": static, "profiles": profiles,
                           "dynamic_hw": dynamic_hw}).encode()

    def deserialize(self, blob: bytes) -> FakeModel:
        self.deserialized.append(blob)
        if self.fail_at == "deserialize":
            raise EngineError("fake tensorrt: deserialize_cuda_engine returned None")
        self.models.append(FakeModel(self, json.loads(blob)))
        return self.models[-1]


class FakeModel:
    def __init__(self, runtime: FakeTrtRuntime, desc: dict) -> None:
        self._runtime = runtime
        h, w = desc["hw"]
        batch = desc["static"] or -1
        f32 = np.dtype(np.float32)
        self._concrete = (  # what a context works with once its input shape is set
            TensorInfo(desc["input"], True, (batch, 3, h, w), f32),
            TensorInfo("pooled", False, (batch, 3), f32),
            TensorInfo("scaled", False, (batch, 3, h, w), f32),
        )
        # What the engine declares: like TensorRT, -1 wherever a dim follows a dynamic input dim.
        dh, dw = (-1, -1) if desc.get("dynamic_hw") else (h, w)
        self.tensors = (
            TensorInfo(desc["input"], True, (batch, 3, dh, dw), f32),
            TensorInfo("pooled", False, (batch, 3), f32),
            TensorInfo("scaled", False, (batch, 3, dh, dw), f32),
        )
        if runtime.reverse_outputs:
            self.tensors = (self.tensors[0], *reversed(self.tensors[1:]))
        if runtime.extra_input:
            self.tensors = (*self.tensors, TensorInfo(runtime.extra_input, True, (batch, 1), f32))
        self._profiles = [tuple(p) for p in desc["profiles"]] or [(batch, batch, batch)]
        self.num_profiles = len(self._profiles)
        self.dynamic = bool(desc["profiles"]) or bool(desc.get("dynamic_hw"))
        self.profile_owners: dict[int, FakeContext] = {}
        self.released = False

    def profile_batch_range(self, input_name: str, index: int) -> tuple[int, int, int]:
        return self._profiles[index]

    def create_context(self) -> FakeContext:
        if self._runtime.fail_at == "context":
            raise EngineError("fake tensorrt: create_execution_context returned None")
        return FakeContext(self._runtime, self._concrete, self)

    def release(self) -> None:
        self.released = True


class FakeContext:
    """Checks what TensorRT checks (profile set, shape within it, addresses set) and computes on the stream."""

    def __init__(self, runtime: FakeTrtRuntime, tensors: tuple[TensorInfo, ...], model: FakeModel) -> None:
        self._runtime = runtime
        self._tensors = tensors
        self._model = model
        self._profile: int | None = None
        self._rows: int | None = None
        self._addresses: dict[str, int] = {}
        self._ran_plainly: set[tuple[int, int | None]] = set()
        self.executions = 0
        self.released = False
        if not model.dynamic:
            self._profile = 0  # a static engine has one implicit profile, which every context may use
        elif 0 not in model.profile_owners:
            self._take_profile(0)  # like TensorRT: the first context gets profile 0, later ones must choose

    def _take_profile(self, index: int) -> None:
        owner = self._model.profile_owners.get(index)
        if owner is not None and owner is not self:
            raise EngineError(f"fake tensorrt: profile {index} is in use by another execution context "
                              "(each context in concurrent use needs its own optimization profile)")
        if self._profile is not None and self._model.profile_owners.get(self._profile) is self:
            del self._model.profile_owners[self._profile]
        self._model.profile_owners[index] = self

    def set_optimization_profile(self, index: int, stream: HostStream) -> None:
        if not 0 <= index < self._model.num_profiles:
            raise EngineError(f"fake tensorrt: no optimization profile {index}")
        if self._model.dynamic:
            self._take_profile(index)
        self._profile = index
        self._rows = None

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if name != self._tensors[0].name or shape[1:] != self._tensors[0].shape[1:]:
            raise EngineError(f"fake tensorrt: bad input shape {name} {shape}")
        low, _, high = self._model.profile_batch_range(name, self._profile or 0)
        if not low <= shape[0] <= high:
            raise EngineError(f"fake tensorrt: shape {shape} is outside profile {self._profile} ({low}..{high})")
        self._rows = shape[0]

    def set_tensor_address(self, name: str, ptr: int) -> None:
        if name not in {t.name for t in self._tensors}:
            raise EngineError(f"fake tensorrt: no tensor {name!r}")
        if ptr % TENSOR_ALIGNMENT:
            raise EngineError(f"fake tensorrt: address of {name} ({ptr:#x}) is not {TENSOR_ALIGNMENT}-byte aligned")
        self._addresses[name] = ptr

    def release(self) -> None:
        self.released = True
        if self._profile is not None and self._model.profile_owners.get(self._profile) is self:
            del self._model.profile_owners[self._profile]

    def execute(self, stream: HostStream) -> None:
        device = self._runtime.device
        if device.peek_last_error() is not None:
            raise EngineError(f"fake tensorrt: execute_async_v3 failed: pending CUDA error {device.peek_last_error()}")
        if self._rows is None or len(self._addresses) != len(self._tensors):
            raise EngineError("fake tensorrt: execute before shapes/addresses were set")
        shape_key = (self._rows, self._profile)
        if stream.capture is not None and shape_key not in self._ran_plainly:
            device.set_last_error("cudaErrorStreamCaptureInvalidated")
            raise EngineError("fake tensorrt: enqueue during capture of a shape that never ran uncaptured")
        if stream.capture is None:
            self._ran_plainly.add(shape_key)
        device, rows = self._runtime.device, self._rows
        inp = self._tensors[0]
        in_ptr = self._addresses[inp.name]
        out_ptrs = [self._addresses[t.name] for t in self._tensors[1:]]
        frame_shape = inp.shape[1:]
        in_bytes = rows * int(np.prod(frame_shape)) * 4
        runtime, concurrency = self._runtime, self._runtime.concurrency

        def run() -> None:  # runs on the stream thread, with the addresses of enqueue time (like a graph)
            concurrency.enter()
            try:
                if runtime.exec_delay_s:  # read at run time, so a graph captured during warm-up is slow too
                    time.sleep(runtime.exec_delay_s)
                x = device.view(in_ptr, in_bytes).view(np.float32).reshape(rows, *frame_shape)
                for ptr, value in zip(out_ptrs, reference(x), strict=True):
                    device.view(ptr, value.nbytes)[:] = value.reshape(-1).view(np.uint8)
            finally:
                concurrency.leave()

        self.executions += 1
        device.enqueue(stream, run, kind="execute")
