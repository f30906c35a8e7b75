"""The only place where stages are built, wired, started and stopped.

Threads (one owner each, named ``detstream.<stage>[.<source>]``)::

    detstream.decode.<id>  ×N  ── Batcher/FrameRing ──▶ detstream.engine ──queue──▶ detstream.postprocess ──▶ ZMQ
                                                                                     └──queue──▶ detstream.annotate

Shutdown is a feature: :meth:`Pipeline.stop` stops the sources; each closes
its stream, the batcher drains, the engine stage sends its end sentinel, the
postprocess stage publishes what is in flight and the final statuses, then
closes the socket with linger. Nothing decoded before the stop is lost.
"""

from __future__ import annotations

import ctypes
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.batcher import Batcher
from app.config import DetstreamConfig, EngineConfig, SourceMode
from app.engines import create_engine
from app.engines.base import Engine
from app.errors import ConfigError
from app.metrics import PipelineMetrics
from app.models.spec import load_model_spec
from app.models.store.registry import ensure_default_model, resolve_model
from app.publish.zmq import ZmqPublisher
from app.ring import FrameRing, aligned_empty
from app.sources import create_source
from app.sources.base import FrameSource, SourceStatus
from app.stages.annotate import AnnotateSink
from app.stages.inference import InferenceStage
from app.stages.results import ResultsStage
from app.types import FrameResult, ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "yolov3-tiny"


@dataclass
class RunReport:
    """How a run ended, for the CLI's exit code and final lines."""

    published: dict[str, int]
    dropped: dict[str, int]
    states: dict[str, str]
    reasons: dict[str, str]
    engine: str
    elapsed_s: float

    @property
    def failed(self) -> dict[str, str]:
        return {sid: self.reasons[sid] for sid, state in self.states.items() if state == "failed"}


def load_spec(config: DetstreamConfig, models_dir: Path, cache_dir: Path | None) -> ModelSpec:
    """Resolve the configured model to a file (fetching the default one if needed) and read its spec."""
    model = config.model
    target = model.path or model.name or DEFAULT_MODEL
    if target == DEFAULT_MODEL and model.path is None:
        path = ensure_default_model(models_dir, cache_dir)
    else:
        path = resolve_model(target, models_dir)
    return load_model_spec(path, name=model.name if model.path is None else None,
                           layout_override=model.format, names_file=model.names_file)


def ring_geometry(config: DetstreamConfig, engine_max_batch: int) -> tuple[int, int]:
    """(slots, per-stream quota): every stream is guaranteed its quota, so none can starve another.

    By default the ring holds two of the batches the engine really runs (one in flight, one filling),
    and at least three frames per stream.
    """
    return ring_slots(len(config.sources), config.engine, engine_max_batch)


def ring_slots(streams: int, engine: EngineConfig, engine_max_batch: int) -> tuple[int, int]:
    """:func:`ring_geometry` for ``streams`` sources (the benchmark sizes rings of runs it has not started)."""
    if engine.ring_slots:
        quota = max(1, engine.ring_slots // streams)
    else:
        quota = max(3, math.ceil(2 * min(engine.max_batch, engine_max_batch) / streams))
    return quota * streams, quota


def use_rect(config: DetstreamConfig, engine: Engine) -> bool:
    """Rectangular letterboxing: asked for (``model.rect``) and possible (dynamic model input, engine accepts it)."""
    return bool(config.model.rect and engine.spec.dynamic_hw and engine.accepts_dynamic_hw)


def in_flight_batches(config: DetstreamConfig) -> int:
    """Submitted batches the engine stage may queue for the postprocess thread: one per context, at least two."""
    return config.engine.in_flight


def _return_freed_memory() -> None:
    """Give the ~100 MB that ONNX Runtime's load and graph optimisation freed back to the OS (glibc keeps it)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim, nothing lost
        logger.debug("malloc_trim unavailable")


def _check_output_dir(path: str | None) -> None:
    """Fail before the model loads when annotations could not be written."""
    if path is None:
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"annotate.dir {path}: exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"annotate.dir {path}: cannot create ({error.strerror})") from None


class Pipeline:
    """A configured run: build with the config, then :meth:`start`, :meth:`wait`, :meth:`stop`."""

    def __init__(self, config: DetstreamConfig, *, models_dir: Path = Path("models"), cache_dir: Path | None = None,
                 engine: Engine | None = None, metrics: PipelineMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or PipelineMetrics()
        self._models_dir = models_dir
        self._cache_dir = cache_dir
        self._engine = engine
        self._stop = threading.Event()
        self._force = threading.Event()
        self._statuses: queue.SimpleQueue[SourceStatus] = queue.SimpleQueue()
        self._sources: list[FrameSource] = []
        self._annotate: AnnotateSink | None = None
        self._started_at = 0.0
        self.publisher: ZmqPublisher | None = None
        self.results: ResultsStage | None = None
        self.ready = threading.Event()

    # -- building ------------------------------------------------------------
    def start(self) -> None:
        """Bind the publisher, load the engine, then start every stage; sources last."""
        cfg = self.config
        _check_output_dir(cfg.annotate.dir)
        self.publisher = ZmqPublisher(cfg.publish)
        try:
            self._build_and_start()
        except BaseException:
            self.publisher.close()
            raise

    def _build_and_start(self) -> None:
        cfg = self.config
        t_bound = time.monotonic()
        spec = self._engine.spec if self._engine else load_spec(cfg, self._models_dir, self._cache_dir)
        if self._engine is None:
            self._engine = create_engine(spec, cfg.engine)  # warmed up; falls back with one log line
        engine = self._engine
        _return_freed_memory()
        self.metrics.engine.info({"backend": engine.backend, "model": spec.name, "sha256": spec.sha256[:16]})
        rect = use_rect(cfg, engine)
        logger.info("model %s (%dx%d%s, %s) on %s", spec.name, spec.input_width, spec.input_height,
                    ", rectangular inputs" if rect else "", spec.layout, engine.backend)
        slots, quota = ring_geometry(cfg, max(engine.batch_sizes))
        allocator = self._allocator(engine)
        ring = FrameRing(slots, spec.input_height, spec.input_width, allocator)
        # The ring is the one allocation that grows with the stream count, and pageable slots become resident
        # as they are first written (a backlog fills them all): operators size memory limits from this line.
        logger.info("frame ring: %d slots of 3x%dx%d float32 (%d per stream), %.1f MiB, %s", slots,
                    spec.input_height, spec.input_width, quota, ring.buffer.nbytes / 2**20,
                    "page-locked" if getattr(allocator, "pinned", False) else "pageable (resident once used)")
        batcher = Batcher(ring, cfg.engine.max_batch, cfg.engine.max_wait_ms / 1e3, quota,
                          on_admit=self.metrics.count_decoded)
        keep_image = cfg.annotate.dir is not None
        for source_cfg in cfg.sources:
            live = source_cfg.effective_mode is SourceMode.LIVE
            batcher.add_stream(source_cfg.id, live, source_cfg.max_staleness_ms / 1e3)
            self._sources.append(create_source(source_cfg, batcher, self._statuses.put,
                                               input_hw=(spec.input_height, spec.input_width), stride=spec.stride,
                                               rect=rect, pixel_scale=spec.scale, keep_image=keep_image))
        # Handles waiting for the postprocess thread: enough to keep every context busy, bounded by the
        # engine's output sets (which outlive this many handles plus one being read and one being submitted).
        submitted: queue.Queue = queue.Queue(maxsize=in_flight_batches(cfg))
        if keep_image:
            by_id = {s.stream_id: s for s in self._sources}
            self._annotate = AnnotateSink(Path(cfg.annotate.dir), spec.class_names, cfg.annotate.snapshots,
                                          lambda sid: by_id[sid].total_frames)
            self._annotate.start()
        self.results = ResultsStage(cfg, spec, engine.backend, batcher, submitted, self._statuses, self.publisher,
                                    self.metrics, on_frame=self._to_annotate if keep_image else None)
        self._inference = InferenceStage(batcher, engine, submitted, self.metrics, self._force)
        remaining = cfg.publish.startup_wait_s - (time.monotonic() - t_bound)
        if remaining > 0:
            self.publisher.wait_for_subscribers(1, remaining)
        self.results.start()
        self._inference.start()
        self._started_at = time.monotonic()
        for source in self._sources:
            if self._stop.is_set():  # a signal came while the engine loaded: end at once, publish 'ended'
                source.stop()
            source.start()
        self.ready.set()

    @staticmethod
    def _allocator(engine: Engine):
        """The engine's allocator (page-locked slots when it copies to a GPU); plain aligned memory otherwise."""
        allocator = engine.host_allocator()
        return aligned_empty if allocator is None else allocator

    def _to_annotate(self, result: FrameResult) -> None:
        lossless = self._source_mode(result.meta.stream_id) is SourceMode.FILE
        self._annotate.submit(result, lossless)

    def _source_mode(self, stream_id: str) -> SourceMode:
        return next(s.effective_mode for s in self.config.sources if s.id == stream_id)

    # -- running -------------------------------------------------------------
    @property
    def sources(self) -> list[FrameSource]:
        return list(self._sources)

    def stop(self) -> None:
        """Stop accepting frames; in-flight frames are still published. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.results is not None and not self.done():
            logger.info("stopping: draining frames in flight")
        for source in self._sources:
            source.stop()

    def force_stop(self) -> None:
        """Give up on draining (second signal, or the drain took too long)."""
        self.stop()
        self._force.set()

    def done(self) -> bool:
        return self.results is not None and not self.results.alive

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the run to end (all sources ended and everything published)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Join every thread (bounded) and release the engine; after :meth:`wait` or :meth:`force_stop`."""
        for source in self._sources:
            source.join(timeout_s)
        if self._annotate is not None:
            self._annotate.close()
        inference = getattr(self, "_inference", None)
        if inference is not None and not inference.join(timeout_s):
            logger.warning("engine thread still busy after %.0f s; leaving the engine to process exit", timeout_s)
            return  # releasing a session under a running inference aborts the process
        if self._engine is not None:
            self._engine.close()

    def report(self) -> RunReport:
        progress = self.results.progress if self.results else {}
        return RunReport(published={k: v.published for k, v in progress.items()},
                         dropped={k: v.dropped for k, v in progress.items()},
                         states={k: v.state for k, v in progress.items()},
                         reasons={k: v.reason for k, v in progress.items()},
                         engine=self._engine.backend if self._engine else "",
                         elapsed_s=time.monotonic() - self._started_at if self._started_at else 0.0)
