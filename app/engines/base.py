"""The Engine interface every inference backend implements.

The GPU stage (runs on thread ``detstream.engine``) calls :meth:`Engine.submit`
with views into ring slots and gets a handle back at once; the postprocess
thread calls :meth:`InferenceHandle.wait` in submission order. ONNX Runtime
on the CPU queues one job per frame for its worker threads
(``detstream.engine.ctx<i>``) and returns a handle that waits for them; on a
GPU provider it computes inside ``submit`` and returns a done handle.
TensorRT enqueues on one of its contexts' CUDA streams and returns a handle
that waits on an event, so copies of batch k+1 overlap compute of batch k.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from app.types import FLOAT_CHW, FrameFormat, ModelSpec

HostAllocator = Callable[[tuple[int, ...]], np.ndarray]
"""Makes the ring's frame memory: ``shape -> array`` of the engine's :attr:`Engine.frame_format` dtype
(see :class:`app.ring.FrameRing`)."""


class InferenceHandle(ABC):
    """Completion of one submitted batch."""

    cpu_s: float | None = None
    """CPU seconds this batch's inference took on the host, where the engine measures it (the ONNX
    Runtime CPU workers); None where the work is not CPU time (GPU backends)."""

    @abstractmethod
    def wait(self) -> list[np.ndarray]:
        """Block until done; return the model outputs, each with leading dim = frames submitted.

        The arrays may be reused by the engine after the next ``wait`` on the
        same engine: copy what must outlive that (postprocess does).
        Raises :class:`app.errors.EngineError` when this batch failed.
        """


class Engine(ABC):
    """A loaded model on one backend.

    ``backend`` is what messages carry in ``engine`` (e.g.
    ``onnxruntime:CPUExecutionProvider``, ``tensorrt:fp16``). ``batch_sizes``
    are the sizes the engine runs natively (profiles / graphs / static batch),
    ascending; the batcher closes batches at most ``max(batch_sizes)`` large.

    ``accepts_dynamic_hw`` is True when ``submit`` takes frames letterboxed to
    a smaller rectangle than the nominal input: ``(3, h, w)`` with ``h`` and
    ``w`` multiples of ``spec.stride``, at most ``spec.input_height`` ×
    ``spec.input_width``, the same for every frame of one call. False (the
    default) means every frame is ``(3, spec.input_height, spec.input_width)``.

    ``frame_format`` is what ``submit`` reads, and so what the ring holds:
    ``(3, H, W)`` float32 scaled by ``spec.scale`` (the default), or ``(H, W, 3)``
    uint8 pixels for an engine that does that work in its graph (OpenVINO).
    """

    backend: str
    spec: ModelSpec
    batch_sizes: tuple[int, ...]
    accepts_dynamic_hw: bool = False
    frame_format: FrameFormat = FLOAT_CHW

    @abstractmethod
    def submit(self, frames: Sequence[np.ndarray]) -> InferenceHandle:
        """Start inference on ``frames``, each one frame in :attr:`frame_format` (views into ring slots).

        The caller keeps the frames unmodified until the returned handle's
        ``wait`` has returned (an engine may read them in place, from other
        threads, until then). ``len(frames)`` may be any size up to
        ``max(batch_sizes)``; the engine pads or splits to what it runs.
        ``H, W`` are the nominal input size unless ``accepts_dynamic_hw``.
        Raises ValueError for frames it cannot take (count, shape, mixed shapes).
        """

    batch_window: bool = True
    """Whether waiting up to ``engine.max_wait_ms`` for more frames pays: a batch runs faster per frame than
    its frames one by one (TensorRT, GPU providers). False for the CPU workers, which run every frame alone."""

    def wait_for_room(self, stop: threading.Event) -> int:
        """Runs on the engine thread before it takes a batch: block until the engine can start frames soon,
        and return how many to take (0 once ``stop`` is set).

        Frames the engine has queued but not started cannot be dropped for staleness; frames still in the
        batcher can. An engine with its own job queue (the CPU workers) makes the engine thread wait here,
        so that live frames wait where the live policy applies. The default takes a full batch at once:
        engines that bound their own queue block in :meth:`submit` (TensorRT, one per context).
        """
        return 0 if stop.is_set() else max(self.batch_sizes)

    def host_allocator(self) -> HostAllocator | None:
        """The allocator for the frames this engine reads, or None for plain aligned host memory.

        An engine that copies frames to a GPU returns one that page-locks them (asynchronous copies);
        the pipeline asks here instead of guessing from :attr:`backend`.
        """
        return None

    def warmup(self) -> None:
        """Run once on zeros so that the first real frame is not slow (lazy allocations, graph capture)."""
        fmt = self.frame_format
        self.submit([np.zeros(fmt.shape(self.spec.input_height, self.spec.input_width), fmt.dtype)]).wait()

    def close(self) -> None:  # noqa: B027 - optional hook; engines without resources need nothing
        """Release device memory, contexts and sessions. Idempotent."""


def dynamic_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch``, plus ``max_batch`` itself so the batcher can fill it."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


def first_line(error: BaseException) -> str:
    """The first line of an error's text (ONNX Runtime and OpenVINO messages run to many lines), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
