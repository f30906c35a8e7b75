"""The only place where stages are built, wired, started and stopped.

Threads (one owner each, named ``detstream.<stage>[.<source>]``)::

    detstream.decode.<id>  ×N  ── Batcher/FrameRing ──▶ detstream.engine ──queue──▶ detstream.postprocess ──▶ Publisher
                                                                                     └──▶ ResultSinks (own threads)

Sources may be added, removed and changed while the pipeline runs
(:meth:`Pipeline.add_source`, :meth:`~Pipeline.remove_source`,
:meth:`~Pipeline.update_source`, :meth:`~Pipeline.reload`), up to
:attr:`Pipeline.capacity` (``engine.max_sources``): the ring is allocated for
that many from the start, so an added source takes free slots and the running
ones carry on untouched. A removed source's decoder thread ends, its last
frames go through, its final status is ``ended`` with reason ``removed``,
and then the batcher, the drop ledger and the metrics forget it.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.batcher import Batcher
from app.config import DetstreamConfig, SourceConfig
from app.control import NotRunningError, SourceDiff
from app.drops import DropLedger, DropReason
from app.engines import create_engine
from app.engines.base import Engine
from app.metrics import PipelineMetrics
from app.models.spec import load_model_spec
from app.models.store.registry import ensure_default_model, resolve_model
from app.publish.base import Publisher, ResultSink
from app.publish.zmq import ZmqPublisher
from app.ring import FrameRing
from app.running_sources import RunningSources
from app.sources.base import FrameSource, SourceState, SourceStatus
from app.stages.detect import Detector
from app.stages.inference import InferenceStage
from app.stages.results import ResultsStage, StreamSnapshot
from app.stages.sinks import build_sinks, check_sinks
from app.types import ModelSpec

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "yolov3-tiny"


@dataclass(frozen=True)
class RunReport:
    """How a run ended, for the CLI's exit code and final lines: per stream, read from :meth:`Pipeline.streams`."""

    streams: dict[str, StreamSnapshot]
    engine: str
    elapsed_s: float
    sink_failures: dict[str, str] = field(default_factory=dict)

    @property
    def published(self) -> dict[str, int]:
        return {sid: s.published for sid, s in self.streams.items()}

    @property
    def dropped(self) -> dict[str, int]:
        return {sid: s.dropped for sid, s in self.streams.items()}

    @property
    def dropped_by_reason(self) -> dict[str, dict[DropReason, int]]:
        return {sid: dict(s.dropped_by_reason) for sid, s in self.streams.items()}

    @property
    def states(self) -> dict[str, SourceState]:
        return {sid: s.state for sid, s in self.streams.items()}

    @property
    def reasons(self) -> dict[str, str]:
        return {sid: s.reason for sid, s in self.streams.items()}

    @property
    def failed(self) -> dict[str, str]:
        return {sid: s.reason for sid, s in self.streams.items() if s.state is SourceState.FAILED}


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


RUNTIME_HEADROOM = 4
"""Sources that may be added at runtime when ``http.enabled`` and ``engine.max_sources`` is not set."""


def source_capacity(config: DetstreamConfig) -> int:
    """How many sources the run may hold at once: ``engine.max_sources``, else the configured ones (+ headroom)."""
    configured = len(config.sources)
    if config.engine.max_sources is not None:
        return max(configured, config.engine.max_sources)
    return configured + (RUNTIME_HEADROOM if config.http.enabled else 0)


def _quota(config: DetstreamConfig, streams: int, engine_max_batch: int) -> int:
    """Slots each of ``streams`` streams may hold: two engine batches shared out, at least three each."""
    engine = config.engine
    if engine.ring_slots:
        return max(1, engine.ring_slots // streams)
    return max(3, math.ceil(2 * min(engine.max_batch, engine_max_batch) / streams))


def _ring_geometry(config: DetstreamConfig, engine_max_batch: int) -> tuple[int, int]:
    """(slots, per-stream quota): every stream is guaranteed its quota, so none can starve another.

    By default the ring holds two of the batches the engine really runs (one in flight, one filling),
    and at least three frames per stream, for :func:`source_capacity` streams (so a source added at
    runtime finds its slots free); the quota is that of the configured streams.
    """
    streams, capacity = len(config.sources), source_capacity(config)
    slots = max(_quota(config, n, engine_max_batch) * n for n in (streams, capacity))
    return slots, _quota_within(config, slots, streams, engine_max_batch)


def _quota_within(config: DetstreamConfig, slots: int, streams: int, engine_max_batch: int) -> int:
    return max(1, min(_quota(config, streams, engine_max_batch), slots // max(1, streams)))


def _use_rect(config: DetstreamConfig, engine: Engine) -> bool:
    """Rectangular letterboxing: asked for (``model.rect``) and possible (dynamic model input, engine accepts it)."""
    return bool(config.model.rect and engine.spec.dynamic_hw and engine.accepts_dynamic_hw)


def _return_freed_memory() -> None:
    """Give the ~100 MB that ONNX Runtime's load and graph optimisation freed back to the OS (glibc keeps it)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim, nothing lost
        logger.debug("malloc_trim unavailable")


class Pipeline:
    """A configured run: build with the config, then :meth:`start`, :meth:`wait`, :meth:`stop`, :meth:`close`.

    ``engine``, ``publisher`` and extra ``sinks`` may be passed in (tests, embedding); otherwise the
    engine comes from the config and the publisher is a :class:`ZmqPublisher` on ``publish.endpoint``.
    Health checks, the runner and the progress line read only the public, read-only state below
    (:attr:`stopping`, :attr:`alive`, :attr:`last_publish_at`, :meth:`streams`, ...).
    """

    def __init__(self, config: DetstreamConfig, *, models_dir: Path = Path("models"), cache_dir: Path | None = None,
                 engine: Engine | None = None, metrics: PipelineMetrics | None = None,
                 publisher: Publisher | None = None, sinks: Sequence[ResultSink] = ()) -> None:
        self.config = config
        self.metrics = metrics or PipelineMetrics()
        self.ready = threading.Event()
        self._models_dir = models_dir
        self._cache_dir = cache_dir
        self._engine = engine
        self._publisher = publisher
        self._extra_sinks = list(sinks)
        self._ledger = DropLedger(self.metrics)
        for source_cfg in config.sources:
            self._ledger.add_stream(source_cfg.id)
        self.capacity = source_capacity(config)
        self._batcher: Batcher | None = None
        self._running: RunningSources | None = None
        self._spec: ModelSpec | None = None
        self._stop = threading.Event()
        self._force = threading.Event()
        self._statuses: queue.SimpleQueue[SourceStatus] = queue.SimpleQueue()
        self._sinks: list[ResultSink] = []
        self._results: ResultsStage | None = None
        self._inference: InferenceStage | None = None
        self._started_at = 0.0

    # -- building ------------------------------------------------------------
    def start(self) -> None:
        """Bind the publisher, load the engine, then start every stage; sources last."""
        check_sinks(self.config)
        if self._publisher is None:
            self._publisher = ZmqPublisher(self.config.publish)
        try:
            self._build_and_start()
        except BaseException:
            self._publisher.close()
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
        rect = _use_rect(cfg, engine)
        logger.info("model %s (%dx%d%s, %s) on %s", spec.name, spec.input_width, spec.input_height,
                    ", rectangular inputs" if rect else "", spec.layout, engine.backend)
        self._spec = spec
        batcher = self._batcher = self._build_batcher(spec, engine)
        sinks = [*build_sinks(cfg, spec, self._total_frames), *self._extra_sinks]
        source_args = dict(input_hw=(spec.input_height, spec.input_width), stride=spec.stride, rect=rect,
                           pixel_scale=spec.scale, keep_image=any(sink.needs_image for sink in sinks))
        max_batch = max(engine.batch_sizes)
        self._running = RunningSources(
            list(cfg.sources), capacity=self.capacity, batcher=batcher, statuses=self._statuses, ledger=self._ledger,
            metrics=self.metrics, source_args=source_args, stopping=self._stop,
            quota_for=lambda n: _quota_within(cfg, len(batcher.ring), n, max_batch))
        for sink in sinks:
            sink.start()
            self._sinks.append(sink)
        # Handles waiting for the postprocess thread: enough to keep every context busy, bounded by the
        # engine's output sets (which outlive this many handles plus one being read and one being submitted).
        submitted: queue.Queue = queue.Queue(maxsize=cfg.engine.in_flight)
        self._results = ResultsStage(cfg, Detector(spec, cfg), engine.backend, batcher=batcher, submitted=submitted,
                                     statuses=self._statuses, publisher=self._publisher, sinks=sinks,
                                     ledger=self._ledger, metrics=self.metrics)
        self._inference = InferenceStage(batcher, engine, submitted, self.metrics, self._force)
        remaining = cfg.publish.startup_wait_s - (time.monotonic() - t_bound)
        if remaining > 0:
            self._publisher.wait_for_subscribers(1, remaining)
        self._running.attach(self._results)
        self._results.start()
        self._inference.start()
        self._started_at = time.monotonic()
        for source in self._running.sources():
            if self._stop.is_set():  # a signal came while the engine loaded: end at once, publish 'ended'
                source.stop()
            source.start()
        self.ready.set()

    def _build_batcher(self, spec: ModelSpec, engine: Engine) -> Batcher:
        cfg = self.config
        slots, quota = _ring_geometry(cfg, max(engine.batch_sizes))
        allocator = engine.host_allocator()  # page-locked slots when the engine copies to a GPU
        fmt = engine.frame_format
        ring = FrameRing(slots, spec.input_height, spec.input_width, allocator, fmt)
        # The ring is the one allocation that grows with the stream count, and pageable slots become resident
        # as they are first written (a backlog fills them all): operators size memory limits from this line.
        logger.info("frame ring: %d slots of %s %s (%d per stream), %.1f MiB, %s", slots,
                    "x".join(map(str, fmt.shape(spec.input_height, spec.input_width))), fmt.dtype, quota,
                    ring.buffer.nbytes / 2**20,
                    "page-locked" if getattr(allocator, "pinned", False) else "pageable (resident once used)")
        return Batcher(ring, cfg.engine.max_batch, cfg.engine.max_wait_ms / 1e3, quota,
                       on_admit=self.metrics.count_decoded, drops=self._ledger)

    def _total_frames(self, stream_id: str) -> int | None:
        source = self._running.get(stream_id) if self._running is not None else None
        return source.total_frames if source is not None else None

    # -- public state (read-only; any thread) ---------------------------------
    @property
    def sources(self) -> list[FrameSource]:
        return self._running.sources() if self._running is not None else []

    def source_configs(self) -> dict[str, SourceConfig]:
        """The config of every source running now (configured or added), by id; the configured ones before start."""
        if self._running is None:
            return {s.id: s for s in self.config.sources}
        return self._running.configs()

    @property
    def spec(self) -> ModelSpec | None:
        """The model's spec (class names, input size), once :meth:`start` has loaded it."""
        return self._spec

    @property
    def publisher(self) -> Publisher | None:
        """The publisher, once :meth:`start` has made it (its ``sent``/``dropped_hwm`` counters are safe to read)."""
        return self._publisher

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called (a signal, ``duration_s``, or the caller)."""
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        """The postprocess thread, the only publisher, is running."""
        return self._results is not None and self._results.alive

    @property
    def last_publish_at(self) -> float | None:
        """``time.monotonic()`` of the last message published (heartbeats included); None before :meth:`start`."""
        return self._results.last_publish_at if self._results is not None else None

    @property
    def sink_failures(self) -> dict[str, str]:
        """Optional sink name -> why it stopped (e.g. a full disk under ``--annotate``); empty while all work."""
        return self._results.sink_failures if self._results is not None else {}

    def streams(self) -> dict[str, StreamSnapshot]:
        """A snapshot of every stream (state, counts, latency); empty before :meth:`start`."""
        return self._results.streams() if self._results is not None else {}

    # -- running -------------------------------------------------------------
    def stop(self) -> None:
        """Stop accepting frames; in-flight frames are still published. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._results is not None and not self.done():
            logger.info("stopping: draining frames in flight")
        for source in self.sources:
            source.stop()
        if self._batcher is not None:
            self._batcher.finish()

    def force_stop(self) -> None:
        """Give up on draining (second signal, or the drain took too long)."""
        self.stop()
        self._force.set()

    def done(self) -> bool:
        """The run has ended: started, and the postprocess thread has published everything and exited."""
        return self._results is not None and not self._results.alive

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
        for source in self.sources:
            source.join(timeout_s)
        for sink in self._sinks:
            sink.close()
        if self._inference is not None and not self._inference.join(timeout_s):
            logger.warning("engine thread still busy after %.0f s; leaving the engine to process exit", timeout_s)
            return  # releasing a session under a running inference aborts the process
        if self._engine is not None:
            self._engine.close()

    # -- runtime control (any thread; one operation at a time) -----------------
    def add_source(self, source: SourceConfig) -> SourceConfig:
        """Start another source while running; :class:`app.control.ControlError` when refused."""
        return self._control().add(source)

    def remove_source(self, stream_id: str) -> None:
        """Stop and forget one source; its last status is ``ended`` with reason ``removed``."""
        self._control().remove(stream_id)

    def update_source(self, stream_id: str, changes: Mapping[str, object]) -> tuple[SourceConfig, bool]:
        """Change one source's fields: (its new config, whether it had to be restarted)."""
        return self._control().update(stream_id, changes)

    def reload(self, config: DetstreamConfig) -> SourceDiff:
        """Apply the sources of a re-read config (added, removed, changed); other sections need a restart."""
        ignored = [name for name in type(config).model_fields
                   if name != "sources" and getattr(config, name) != getattr(self.config, name)]
        if ignored:
            logger.warning("reload: changes to %s take effect at the next start", ", ".join(ignored))
        return self._control().reload(config)

    def _control(self) -> RunningSources:
        if self._running is None:
            raise NotRunningError("the pipeline is not running yet")
        return self._running

    def report(self) -> RunReport:
        return RunReport(streams=self.streams(), engine=self._engine.backend if self._engine else "",
                         elapsed_s=time.monotonic() - self._started_at if self._started_at else 0.0,
                         sink_failures=self.sink_failures)
