"""A host fake of TensorRT behind the :mod:`app.engines.tensorrt.runtime` seam.

The fake "builds" an engine description from the real ONNX file (input name,
size, static or dynamic batch, the profile sets) and its execution context
"runs" by queuing a host function on a :class:`HostDevice` stream that
computes :func:`engine_models.reference` from the device input memory into
the device output memory. So results are checkable, copies and graph replay
are real, and a slow context (``exec_delay_s``) shows overlap between streams.

``fail_at`` names the step that raises: ``build``, ``deserialize``, ``context``.
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

    def __init__(self, device: HostDevice, *, fail_at: str | None = None, exec_delay_s: float = 0.0) -> None:
        self.device = device
        self.fail_at = fail_at
        self.exec_delay_s = exec_delay_s
        self.concurrency = Concurrency()
        self.builds = 0
        self.deserialized: list[bytes] = []

    def build(self, onnx_path: Path, options: BuildOptions) -> bytes:
        self.builds += 1
        if self.fail_at == "build":
            raise EngineError("fake tensorrt: unsupported layer NonMaxSuppression")
        model = onnx.load(str(onnx_path))
        dims = model.graph.input[0].type.tensor_type.shape.dim
        static = dims[0].dim_value if dims[0].HasField("dim_value") else None
        dynamic_hw = not (dims[2].HasField("dim_value") and dims[3].HasField("dim_value"))
        h, w = options.input_hw
        profiles = [] if static else [list(p) for _ in range(options.contexts) for p in options.profiles]
        return json.dumps({"input": options.input_name, "hw": [h, w], "static": static, "profiles": profiles,
                           "dynamic_hw": dynamic_hw}).encode()

    def deserialize(self, blob: bytes) -> FakeModel:
        self.deserialized.append(blob)
        if self.fail_at == "deserialize":
            raise EngineError("fake tensorrt: deserialize_cuda_engine returned None")
        return FakeModel(self, json.loads(blob))


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
        self._profiles = [tuple(p) for p in desc["profiles"]] or [(batch, batch, batch)]
        self.num_profiles = len(self._profiles)

    def profile_batch_range(self, input_name: str, index: int) -> tuple[int, int, int]:
        return self._profiles[index]

    def create_context(self) -> FakeContext:
        if self._runtime.fail_at == "context":
            raise EngineError("fake tensorrt: create_execution_context returned None")
        return FakeContext(self._runtime, self._concrete)


class FakeContext:
    """Checks what TensorRT checks (profile set, shape within it, addresses set) and computes on the stream."""

    def __init__(self, runtime: FakeTrtRuntime, tensors: tuple[TensorInfo, ...]) -> None:
        self._runtime = runtime
        self._tensors = tensors
        self._profile: int | None = None
        self._rows: int | None = None
        self._addresses: dict[str, int] = {}
        self.executions = 0

    def set_optimization_profile(self, index: int, stream: HostStream) -> None:
        self._profile = index
        self._rows = None

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if name != self._tensors[0].name or shape[1:] != self._tensors[0].shape[1:]:
            raise EngineError(f"fake tensorrt: bad input shape {name} {shape}")
        self._rows = shape[0]

    def set_tensor_address(self, name: str, ptr: int) -> None:
        self._addresses[name] = ptr

    def execute(self, stream: HostStream) -> None:
        if self._rows is None or len(self._addresses) != len(self._tensors):
            raise EngineError("fake tensorrt: execute before shapes/addresses were set")
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
