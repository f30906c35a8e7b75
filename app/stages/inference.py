"""The GPU stage: takes batches from the batcher and submits them to the engine.

Runs on thread ``detstream.engine``. It never waits for results: handles go
into a bounded queue to the results thread, so with an asynchronous engine
(TensorRT, several contexts) copies and compute of consecutive batches
overlap, and with a synchronous one (ONNX Runtime on a GPU provider)
inference of batch k+1 overlaps postprocessing of batch k.

When any stream is live, it asks the engine for room before taking a batch
(:meth:`Engine.wait_for_room`): ONNX Runtime's CPU workers take a frame only
when a worker is about to need one, so frames wait in the batcher, where a
live stream's staleness limit can still drop them, rather than in the engine's
job queue, where nothing can. With file streams only, batches stay as large as
the ring allows: nothing is dropped either way, and one-frame batches cost
more CPU per frame (postprocess and engine thread). Without the gate, an
overloaded live run queues frames in the engine past ``max_staleness_ms``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from app.batcher import Batch, Batcher
from app.engines.base import Engine, InferenceHandle
from app.metrics import PipelineMetrics
from app.threads import StageThread

logger = logging.getLogger(__name__)


@dataclass
class Submitted:
    """A batch on its way to the results thread: the handle, or the error that replaced it."""

    batch: Batch
    handle: InferenceHandle | None
    error: Exception | None
    t_submit: float
    t_submitted: float


END = None  # sentinel put on the results queue when the engine stage is done


class InferenceStage:
    """Owns thread ``detstream.engine``."""

    def __init__(self, batcher: Batcher, engine: Engine, results: queue.Queue, metrics: PipelineMetrics,
                 force_stop: threading.Event) -> None:
        self._batcher = batcher
        self._engine = engine
        self._results = results
        self._metrics = metrics
        self._force_stop = force_stop
        self._max_batch = min(batcher.max_batch, max(engine.batch_sizes))
        self._thread = StageThread(self._run, "detstream.engine")

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        return self._thread.join_within(timeout_s)

    def _run(self) -> None:
        window = None if self._engine.batch_window else 0.0
        gate = self._batcher.has_live_streams  # file streams lose nothing by queueing; full batches cost less
        try:
            while True:
                room = self._engine.wait_for_room(self._force_stop) if gate else self._max_batch
                if room == 0:  # forced to stop: what is still waiting in the batcher is given up
                    break
                batch = self._batcher.next_batch(self._force_stop, min(self._max_batch, room), window)
                if batch is None:
                    break
                self._results.put(self._submit(batch))
        except Exception:
            logger.exception("engine stage crashed; ending the run")
        finally:
            self._results.put(END)

    def _submit(self, batch: Batch) -> Submitted:
        t_submit = time.monotonic()
        if not batch.slots:
            return Submitted(batch, None, None, t_submit, t_submit)
        self._metrics.batch_size.observe(len(batch.slots))
        self._metrics.ring_occupancy.set(self._batcher.ring.occupancy())
        try:
            handle = self._engine.submit([slot.array for slot in batch.slots])
            return Submitted(batch, handle, None, t_submit, time.monotonic())
        except Exception as error:  # one failed batch must not end the run
            logger.warning("engine failed on a batch of %d frames: %s", len(batch.slots), error)
            return Submitted(batch, None, error, t_submit, time.monotonic())
