"""OvEngine: a model on OpenVINO's CPU plugin, frames run one by one on worker threads.

The work runs as the ONNX Runtime CPU workers' does, on :class:`~app.engines.frame_workers.FrameWorkers`:
``engine.openvino.requests`` worker threads (``detstream.engine.ctx<i>``) each own one infer request per input
size and run single frames from one FIFO; the compiled model has as many CPU streams as there are requests, so
two frames are in flight on two cores. :meth:`OvEngine.wait_for_room` keeps at most one job waiting behind each
worker's run, so live frames wait in the batcher, where the live drop policy applies, and not here.

Input sizes: one static compiled model per ``(height, width)`` (the nominal size at warm-up, each rectangular
size on its first frame); a static shape runs a little faster on the CPU than one dynamic H/W model. Each
compiled model holds its own weights and buffers (about 80 MB for the default model), so the engine keeps only
what frames use: the model file is read again for each new size rather than held, and the nominal model, compiled
to check the file and warm the workers, is released when the first frames of another size arrive before any of
its own. Compiled models are cached on disk (``CACHE_DIR``, :func:`openvino_cache_dir`), so a restart, or a size
compiled again, loads in a fraction of a second instead of compiling.

Input: the ring's uint8 ``(H, W, 3)`` pixels (:data:`~app.types.UINT8_HWC`). OpenVINO's PrePostProcessor puts
the conversion to float, the ``spec.scale`` and the transpose to NCHW into the compiled model (the CPU plugin
runs them as a uint8 transpose and one fused convert-and-scale ahead of the first convolution): the decoder
threads skip the float work, the ring is a quarter of the size, and under bf16 the first convolution's input
comes from exact integer pixels (closer to fp32; docs/engines.md, "Precision").

Precision is OpenVINO's ``INFERENCE_PRECISION_HINT``: ``bf16`` or ``f32``. An INT8 (Q/DQ) model runs as INT8,
its float layers (the stem and decode tail the quantizer keeps in fp32) at the plugin's default: bf16 where the
CPU has it (the decode tail stays f32 there: the plugin keeps a graph's tail in f32 by itself).
Outputs are the model's own tensors, each frame's copied out of its request into its row of the batch's arrays
(allocated per submitted batch), so they go through the same decode as every other backend's.

Threading: ``submit`` runs on the engine thread; ``handle.wait`` on the postprocess thread; ``close`` after the
engine thread has stopped submitting.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.engines.base import Engine, InferenceHandle, dynamic_batch_sizes, first_line
from app.engines.frame_workers import FrameWorkers, JobHandle
from app.errors import EngineError, EngineLoadError
from app.types import UINT8_HWC, ModelSpec

logger = logging.getLogger(__name__)

HINTS = {"bf16": "bf16", "fp32": "f32"}
"""``engine.precision`` (resolved) → OpenVINO's inference precision hint; INT8 takes the plugin's default for its
float layers (bf16 where the CPU computes it)."""


def openvino_cache_dir() -> Path:
    """``$DETSTREAM_CACHE/openvino``, else ``~/.cache/detstream/openvino``: OpenVINO's compiled-model cache."""
    root = os.environ.get("DETSTREAM_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "detstream") / "openvino"


class OvHandle(JobHandle):
    """One submitted batch of frames of size ``hw``: one job per frame, each copying its request's outputs
    into its row of the batch's ``outputs`` (allocated here, one array per model output)."""

    __slots__ = ("hw",)

    def __init__(self, what: str, frames: Sequence[np.ndarray], hw: tuple[int, int], compiled: Any) -> None:
        outputs = [np.empty((len(frames), *out.get_shape()[1:]), out.get_element_type().to_dtype())
                   for out in compiled.outputs]
        super().__init__(what, frames, len(frames), outputs)
        self.hw = hw


class OvEngine(Engine):
    """A model on OpenVINO (see the module docstring); ``precision`` is the resolved one (bf16, fp32, int8)."""

    batch_window = False  # every frame runs alone: waiting for company only adds latency
    frame_format = UINT8_HWC  # pixels; the compiled model converts and scales them (module docstring)

    def __init__(self, spec: ModelSpec, precision: str, *, requests: int = 2, device: str = "CPU",
                 threads: int | None = None, cache_dir: Path | None = None, max_batch: int = 8) -> None:
        try:
            import openvino as ov
        except ImportError as error:
            raise EngineLoadError(f"openvino is not installed ({error}): pip install openvino") from None
        self.spec = spec
        self.precision = precision
        self.device = device
        self.backend = f"openvino:{device}:{precision}"
        self._what = f"{self.backend}: inference failed on {spec.path}"
        self._core = ov.Core()
        cache = cache_dir or openvino_cache_dir()
        try:
            cache.mkdir(parents=True, exist_ok=True)
            self._core.set_property({"CACHE_DIR": str(cache)})
        except OSError as error:
            logger.warning("openvino: no compiled-model cache at %s (%s); compiling on every start", cache, error)
        self._properties: dict[str, Any] = {"NUM_STREAMS": requests, "PERFORMANCE_HINT": "THROUGHPUT"}
        if threads:
            self._properties["INFERENCE_NUM_THREADS"] = threads
        if HINTS.get(precision):
            self._properties["INFERENCE_PRECISION_HINT"] = HINTS[precision]
        self.accepts_dynamic_hw = spec.dynamic_hw
        self.batch_sizes = dynamic_batch_sizes(max_batch)  # any count: every frame is a job of its own
        self._compiled: dict[tuple[int, int], Any] = {}
        self._served: set[tuple[int, int]] = set()  # sizes that frames (not the warm-up) have used
        self._released = 0  # bumped when a compiled size is dropped; workers then drop its requests
        self._compile_lock = threading.Lock()
        self._nominal = (spec.input_height, spec.input_width)
        nominal = self._compile(self._nominal)
        # One run on this thread before any worker starts: the Python bindings initialise function-local statics
        # on first use while releasing the GIL, and two workers doing that first use at once deadlock.
        _infer(nominal.create_infer_request(), np.zeros(UINT8_HWC.shape(*self._shape(nominal)), np.uint8))
        self._workers: FrameWorkers[OvHandle] = FrameWorkers(self._worker, requests)

    @property
    def compiled_sizes(self) -> tuple[tuple[int, int], ...]:
        """The ``(height, width)`` sizes compiled now."""
        return tuple(self._compiled)

    @property
    def inference_precision(self) -> str:
        """The float precision the compiled model runs (OpenVINO's ``INFERENCE_PRECISION_HINT``: bf16, f32)."""
        with self._compile_lock:
            compiled = next(iter(self._compiled.values()), None)
        compiled = compiled or self._compile(self._nominal)
        return compiled.get_property("INFERENCE_PRECISION_HINT").to_string()

    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        """Engine thread: check the frames, compile their size if new, queue one job per frame."""
        hw = self._check(frames)
        if hw not in self._served:
            self._served.add(hw)
            if self._nominal not in self._served and self._compiled.pop(self._nominal, None) is not None:
                self._released += 1  # only the warm-up ran it: its weights and buffers go (see module docstring)
        return self._queue(frames, hw)

    def _queue(self, frames: Sequence[np.ndarray], hw: tuple[int, int]) -> OvHandle:
        if self._workers.closed:
            raise EngineError(f"{self.backend}: submit after close")
        handle = OvHandle(self._what, frames, hw, self._compile(hw))
        self._workers.put(handle, len(frames))
        return handle

    def wait_for_room(self, stop: threading.Event, poll_s: float = 0.05) -> int:
        """Block while every worker already has a job waiting behind its run (see :meth:`Engine.wait_for_room`);
        then how many more jobs keep each worker one job ahead."""
        return self._workers.wait_for_room(stop, max(self.batch_sizes), poll_s)

    def warmup(self) -> None:
        """Run every worker twice at the nominal size (first runs allocate)."""
        zeros = np.zeros(UINT8_HWC.shape(*self._nominal), np.uint8)
        count = min(self._workers.count, max(self.batch_sizes))
        for _ in range(2 * self._workers.count // count):
            self._queue([zeros] * count, self._nominal).wait()

    def close(self) -> None:
        """Fail the jobs not started, let running ones finish, join the workers, then drop the compiled models.
        Idempotent."""
        self._workers.close()
        self._compiled.clear()

    def _compile(self, hw: tuple[int, int]) -> Any:
        with self._compile_lock:
            compiled = self._compiled.get(hw)
            if compiled is not None:
                return compiled
            t0 = time.monotonic()
            try:
                model = self._core.read_model(self.spec.path)
            except Exception as error:
                raise EngineLoadError(f"openvino cannot read {self.spec.path}: {first_line(error)}") from None
            try:
                model.reshape({model.inputs[0].any_name: [1, 3, *hw]})
                compiled = self._core.compile_model(self._takes_pixels(model), self.device, self._properties)
            except Exception as error:
                raise EngineLoadError(f"openvino cannot compile {self.spec.path} at {hw[1]}x{hw[0]}: "
                                      f"{first_line(error)}") from None
            self._compiled[hw] = compiled
            logger.debug("openvino: %s at %dx%d ready in %.2f s", self.spec.name, hw[1], hw[0], time.monotonic() - t0)
            return compiled

    def _worker(self) -> Callable[[OvHandle, int], None]:
        """Runs once on each ``detstream.engine.ctx<i>``: its job function, with one infer request per input size."""
        requests: dict[tuple[int, int], Any] = {}
        compiled = self._compiled
        released = self._released

        def run(handle: OvHandle, job: int) -> None:
            nonlocal released
            if released != self._released:  # a compiled size was dropped: so are its requests here
                released = self._released
                for hw in [hw for hw in requests if hw not in compiled]:
                    del requests[hw]
            request = requests.get(handle.hw)
            if request is None:
                request = requests[handle.hw] = compiled[handle.hw].create_infer_request()
            _infer(request, handle.frames[job])
            for out, tensor in zip(handle.outputs, request.output_tensors, strict=True):
                np.copyto(out[job], tensor.data[0])  # the request reuses its tensors: copied into the frame's row

        return run

    def _takes_pixels(self, model: Any) -> Any:
        """``model`` with its input turned into ``(1, H, W, 3)`` uint8 pixels: convert, scale and transpose in
        the graph (OpenVINO's PrePostProcessor)."""
        import openvino as ov
        from openvino.preprocess import PrePostProcessor

        ppp = PrePostProcessor(model)
        ppp.input().tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC"))
        steps = ppp.input().preprocess().convert_element_type(ov.Type.f32)
        if self.spec.scale != 1.0:
            steps.scale(1.0 / self.spec.scale)
        ppp.input().model().set_layout(ov.Layout("NCHW"))
        return ppp.build()

    @staticmethod
    def _shape(compiled: Any) -> tuple[int, int]:
        shape = compiled.inputs[0].get_shape()  # NHWC
        return int(shape[1]), int(shape[2])

    def _check(self, frames: Sequence[np.ndarray]) -> tuple[int, int]:
        n = len(frames)
        if not 0 < n <= max(self.batch_sizes):
            raise ValueError(f"OvEngine.submit: {n} frames (allowed 1..{max(self.batch_sizes)})")
        shape = frames[0].shape
        if any(frame.shape != shape for frame in frames):
            raise ValueError("OvEngine.submit: frames of different shapes in one batch")
        spec = self.spec
        if len(shape) != 3 or shape[2] != 3 or frames[0].dtype != np.uint8:
            raise ValueError(f"OvEngine.submit: frames must be (height, width, 3) uint8 pixels, got {shape} "
                             f"{frames[0].dtype}")
        height, width = shape[0], shape[1]
        if (height, width) == (spec.input_height, spec.input_width):
            return height, width
        if not (self.accepts_dynamic_hw and 0 < height <= spec.input_height and 0 < width <= spec.input_width
                and height % spec.stride == 0 and width % spec.stride == 0):
            raise ValueError(f"OvEngine.submit: frames are {shape}; the model takes ({spec.input_height}, "
                             f"{spec.input_width}, 3)" + (f" or multiples of {spec.stride} below" if
                                                        self.accepts_dynamic_hw else ""))
        return height, width


def _infer(request: Any, frame: np.ndarray) -> None:
    """One frame through ``request``, read in place; its outputs stay in the request's tensors."""
    request.infer({0: np.ascontiguousarray(frame)[None]}, share_inputs=True)
