"""TensorRTEngine: a deserialized TensorRT engine run on several execution contexts.

Set-up (engine thread): per context (``engine.tensorrt.contexts``) an execution context, a stream, an
event, device input/output buffers for the largest batch and a small pinned staging buffer;
``contexts + 1`` pinned output sets shared by all contexts. Batches are scheduled by
:class:`~app.engines.tensorrt.scheduler.BatchScheduler` (round-robin, buckets, CUDA graphs).
``backend`` is ``tensorrt:<precision>``, the precision the engine really runs.

Tensors are matched by name: the engine's one input must be the model's image input (another input
is refused, not left without an address), and outputs come back in the ONNX model's output order
whatever order the engine lists them in. An engine with dynamic shapes gives each context its own
set of optimization profiles (TensorRT forbids two contexts in use on one profile).

:func:`open_tensorrt_engine` is the whole "try TensorRT" path used by
``create_engine``: model file for the precision, cache lookup or build, deserialize, contexts, warm-up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from app.config import EngineConfig
from app.engines.base import Engine, HostAllocator, InferenceHandle
from app.engines.cuda.device import Device
from app.engines.cuda.host_memory import HostBuffer, PinnedAllocator, alloc_host
from app.engines.shapes import OutputShapes
from app.engines.tensorrt.cache import EngineCacheKey, cache_path, load_or_build
from app.engines.tensorrt.precision import model_for_precision, trt_precision
from app.engines.tensorrt.profiles import bucket_sizes, plan_profiles
from app.engines.tensorrt.runtime import BuildOptions, TensorInfo, TrtContext, TrtModel, TrtRuntime
from app.engines.tensorrt.scheduler import (
    DEFAULT_SUBMIT_TIMEOUT_S,
    BatchLayout,
    BatchScheduler,
    ContextSlot,
    OutputPool,
    OutputSet,
)
from app.errors import EngineError, EngineLoadError
from app.models.store.files import sha256_file
from app.types import ModelSpec

logger = logging.getLogger(__name__)


class TensorRTEngine(Engine):
    """A model on TensorRT (see the module docstring). ``close()`` releases everything it allocated."""

    def __init__(
        self,
        spec: ModelSpec,
        config: EngineConfig,
        device: Device,
        model: TrtModel,
        *,
        submit_timeout_s: float = DEFAULT_SUBMIT_TIMEOUT_S,
        precision: str | None = None,
    ) -> None:
        self.spec = spec
        self.backend = f"tensorrt:{precision or trt_precision(config.precision)}"
        self._device = device
        self._model: TrtModel | None = model
        self._contexts: list[TrtContext] = []
        self._frees: list[tuple[str, object]] = []
        self._host: list[HostBuffer] = []
        self._closed = False
        self.owns_device = False
        try:
            self._scheduler = self._setup(config, submit_timeout_s)
        except Exception:
            self.close()
            raise
        self.batch_sizes = self._scheduler.buckets

    def _setup(self, config: EngineConfig, submit_timeout_s: float) -> BatchScheduler:
        spec, device, model = self.spec, self._device, self._model
        assert model is not None
        inp, dynamic = _input_tensor(model, spec)
        outputs = _resolved_outputs(model, spec)
        frame_shape = (3, spec.input_height, spec.input_width)
        static = inp.shape[0] if inp.shape[0] > 0 else None
        per_context = _profiles_per_context(model, spec.input_name, config.tensorrt.contexts, static, dynamic)
        if static is None:
            low, high = per_context[0][0][0], per_context[0][-1][2]
            buckets = bucket_sizes(low, min(high, max(config.max_batch, low)))
            rows = buckets[-1]
        else:
            buckets = (static,)
            rows = math.ceil(max(config.max_batch, static) / static) * static
        layout = BatchLayout(spec.input_name, frame_shape, inp.dtype, tuple(t.name for t in outputs),
                             tuple(_row_bytes(t) for t in outputs), buckets, static)
        slots = []
        for index, profiles in enumerate(per_context):
            stream = device.stream_create()
            self._frees.append(("stream", stream))
            done = device.event_create()
            self._frees.append(("event", done))
            d_input = device.malloc(layout.input_device_bytes(rows))
            self._frees.append(("malloc", d_input))
            d_outputs = []
            for nbytes in layout.output_device_bytes(rows):
                d_outputs.append(device.malloc(nbytes))
                self._frees.append(("malloc", d_outputs[-1]))
            staging = self._pinned((rows, *frame_shape), inp.dtype)
            context = model.create_context()
            self._contexts.append(context)
            base = index * len(profiles) if dynamic else 0
            slots.append(ContextSlot(index, context, stream, done, d_input, d_outputs, list(profiles), base, staging))
        sets = []
        for _ in range(len(slots) + 1):
            event = device.event_create()
            self._frees.append(("event", event))
            sets.append(OutputSet([self._pinned((rows, *t.shape[1:]), t.dtype) for t in outputs], event))
        return BatchScheduler(device, slots, OutputPool(sets, submit_timeout_s), layout,
                              use_graphs=config.tensorrt.cuda_graphs)

    def _pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> HostBuffer:
        buffer = alloc_host(shape, dtype, device=self._device)
        self._host.append(buffer)
        return buffer

    def host_allocator(self) -> HostAllocator:
        """Page-locked ring slots, so that the frame copies to the GPU are truly asynchronous."""
        return PinnedAllocator()

    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        """Runs on the engine thread: enqueue on the next context and return at once."""
        return self._scheduler.submit(frames)

    def warmup(self) -> None:
        """Run every bucket on every context twice: TensorRT's first-run set-up, then graph capture."""
        zeros = np.zeros((self._scheduler.max_frames, 3, self.spec.input_height, self.spec.input_width),
                         np.float32)
        for bucket in self.batch_sizes if self._scheduler.static_batch is None else (self._scheduler.max_frames,):
            for _ in range(2 * len(self._scheduler.slots)):
                self.submit(list(zeros[:bucket])).wait()

    def close(self) -> None:
        """Release graphs, contexts, the engine, buffers, events and streams (after the streams drained). Idempotent.

        Pinned output sets go back to the device only when the consumer dropped its views of them
        (:class:`~app.engines.cuda.host_memory.HostBuffer`), so a results thread still reading the last
        batch never reads freed memory.
        """
        if self._closed:
            return
        self._closed = True
        scheduler = getattr(self, "_scheduler", None)
        for slot in scheduler.slots if scheduler else []:
            self._quietly("drain", lambda s=slot: self._device.event_synchronize(s.done) if s.busy else None)
            for graph in slot.graphs.values():
                self._quietly("graph", lambda g=graph: self._device.graph_exec_destroy(g))
            slot.graphs.clear()
        for context in self._contexts:
            self._quietly("context", context.release)
        self._contexts.clear()
        if self._model is not None:
            self._quietly("engine", self._model.release)
            self._model = None
        release = {"stream": self._device.stream_destroy, "event": self._device.event_destroy,
                   "malloc": self._device.free}
        for kind, handle in reversed(self._frees):
            self._quietly(kind, lambda k=kind, h=handle: release[k](h))
        self._frees.clear()
        for buffer in self._host:
            self._quietly("host", buffer.free)
        self._host.clear()
        if self.owns_device:
            self._device.close()

    @staticmethod
    def _quietly(what: str, release: object) -> None:
        """Teardown keeps going after one failed release; the failure is logged, not hidden."""
        try:
            release()  # type: ignore[operator]
        except EngineError as error:
            logger.warning("TensorRT engine close: releasing %s failed: %s", what, error)


def open_tensorrt_engine(
    spec: ModelSpec, config: EngineConfig, device: Device, runtime: TrtRuntime, cache_dir: Path
) -> TensorRTEngine:
    """Model file → cached or freshly built engine → contexts → warm-up. Raises on any failure (caller falls back)."""
    precision = trt_precision(config.precision)
    onnx_path = model_for_precision(Path(spec.path), precision, cache_dir, spec.sha256)
    profiles = plan_profiles(1, config.max_batch, config.max_batch)
    key = EngineCacheKey(
        onnx_sha256=sha256_file(onnx_path) if onnx_path != Path(spec.path) or not spec.sha256 else spec.sha256,
        trt_version=runtime.version,
        gpu_name=device.device_name(),
        compute_capability=device.compute_capability(),
        precision=precision,
        profiles=profiles,
        contexts=config.tensorrt.contexts,
    )
    options = BuildOptions(
        input_name=spec.input_name, input_hw=(spec.input_height, spec.input_width), precision=precision,
        profiles=profiles, contexts=config.tensorrt.contexts, timing_cache=cache_dir / "timing.cache",
    )
    path = cache_path(cache_dir, onnx_path.stem, key)
    blob = load_or_build(path, key, lambda: runtime.build(onnx_path, options))
    engine = TensorRTEngine(spec, config, device, runtime.deserialize(blob), precision=precision)
    try:
        engine.warmup()
    except Exception:
        engine.close()
        raise
    return engine


def _input_tensor(model: TrtModel, spec: ModelSpec) -> tuple[TensorInfo, bool]:
    """The engine's image input, with its frame dims as the engine runs them, and whether its shape is dynamic.

    A model with dynamic height and width (``spec.dynamic_hw``) declares them -1; the build profiles
    pin them to the nominal ``input_height × input_width`` (TensorRT runs square inputs only). Any other
    engine input is refused: detstream feeds one image tensor, and TensorRT refuses to run a context
    with an input that has no address.
    """
    inputs = [t for t in model.tensors if t.is_input]
    extra = [t.name for t in inputs if t.name != spec.input_name]
    if extra and any(t.name == spec.input_name for t in inputs):
        raise EngineLoadError(f"engine has inputs {extra} besides the image input {spec.input_name!r}; "
                              "detstream feeds one image input only")
    for tensor in inputs:
        if tensor.name == spec.input_name:
            dynamic = any(d < 0 for d in tensor.shape)
            expected = (3, spec.input_height, spec.input_width)
            declared = tuple(tensor.shape[1:])
            open_hw = spec.dynamic_hw and len(declared) == 3 and declared[0] == 3 and all(
                d in (-1, e) for d, e in zip(declared[1:], expected[1:], strict=True))
            if declared != expected and not open_hw:
                raise EngineLoadError(f"engine input {tensor.name} is {tensor.shape}, model spec says (N, *{expected})")
            return replace(tensor, shape=(tensor.shape[0], *expected)), dynamic
    raise EngineLoadError(f"engine has no input {spec.input_name!r} (inputs: {[t.name for t in inputs]})")


def _resolved_outputs(model: TrtModel, spec: ModelSpec) -> list[TensorInfo]:
    """Engine outputs with dims the engine leaves open (-1 past the batch dim) filled in from the ONNX file.

    An engine built from a dynamic-H/W model declares e.g. ``(-1, -1, 85)``: the box count follows the
    input size, which the profiles fix at the nominal one. ONNX shape inference at that size gives it.
    """
    outputs = _outputs_by_name(model, spec)
    if all(d >= 0 for t in outputs for d in t.shape[1:]):
        return outputs
    trailing = OutputShapes(Path(spec.path), spec, [t.name for t in outputs])()
    resolved = []
    for tensor, shape in zip(outputs, trailing, strict=True):
        if any(d < 0 for d in tensor.shape[1:]) and shape is not None and len(shape) == len(tensor.shape) - 1:
            tensor = replace(tensor, shape=(tensor.shape[0], *shape))
        resolved.append(tensor)
    return resolved


def _outputs_by_name(model: TrtModel, spec: ModelSpec) -> list[TensorInfo]:
    """The engine's outputs in the ONNX model's output order, matched by name (engines may list them otherwise)."""
    outputs = {t.name: t for t in model.tensors if not t.is_input}
    names = model_output_names(Path(spec.path))
    if names is None:
        return list(outputs.values())
    if set(names) != set(outputs):
        raise EngineLoadError(f"engine outputs {sorted(outputs)} are not the model's outputs {names}")
    return [outputs[name] for name in names]


def model_output_names(path: Path) -> list[str] | None:
    """The graph output names of the ONNX file at ``path`` in order, or None when it cannot be read."""
    import onnx

    try:
        return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    except Exception as error:  # an unreadable file is reported by the model loader, not here
        logger.debug("cannot read output names of %s: %s", path, error)
        return None


def _row_bytes(tensor: TensorInfo) -> int:
    if any(d < 0 for d in tensor.shape[1:]):
        raise EngineLoadError(f"output {tensor.name} has a data-dependent shape {tensor.shape}: not supported")
    return math.prod(tensor.shape[1:]) * tensor.dtype.itemsize


def _profiles_per_context(
    model: TrtModel, input_name: str, contexts: int, static: int | None, dynamic: bool
) -> list[tuple[tuple[int, int, int], ...]]:
    """Split the engine's profiles into ``contexts`` equal sets (see :class:`BuildOptions`).

    A fully static engine has one implicit profile, which all contexts may share; a dynamic one (even
    with a fixed batch, when height and width are open) needs a profile per context.
    """
    if not dynamic:
        return [((static, static, static),)] * contexts
    if model.num_profiles < contexts or model.num_profiles % contexts:
        raise EngineLoadError(f"engine has {model.num_profiles} optimization profiles, not a set per each of "
                              f"{contexts} contexts (rebuild it with contexts={contexts})")
    per = model.num_profiles // contexts
    ranges = [model.profile_batch_range(input_name, i) for i in range(model.num_profiles)]
    return [tuple(ranges[c * per:(c + 1) * per]) for c in range(contexts)]
