"""The sources of a running pipeline, and the operations that change them while it runs.

:class:`RunningSources` owns each source's decoder and config; the
:class:`app.pipeline.Pipeline` builds it once the engine is loaded and
delegates its runtime control to it. One operation runs at a time (a lock),
and every one leaves the other sources untouched:

* add: the stream joins the batcher's rotation, the results stage and the drop
  ledger, then its decoder starts; refused when :attr:`capacity` sources run
  (the ring is sized for them) or the id is taken.
* remove: its decoder is stopped and joined, its terminal status (``ended``,
  reason ``removed``) goes out after its last frame, and then the batcher, the
  results stage, the drop ledger and the metrics forget it.
* update: ``max_fps`` and ``max_staleness_ms`` are applied in place, and so are
  zones and lines (:meth:`app.stages.detect.Detector.set_regions`: a new or
  changed zone or line starts from zero counts, unchanged ones keep theirs, and
  the metrics series of those gone or changed are removed); any other change
  restarts that one source.
* reload: the difference with a re-read config, as the three operations above.

A zone or line whose ``classes:`` names a label the model does not have is
refused before anything changes (:class:`app.control.FieldError`, 422).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.batcher import Batcher
from app.config import DetstreamConfig, SourceConfig, SourceMode, derive_source_id
from app.control import (
    ANALYTICS_FIELDS,
    LIVE_FIELDS,
    CapacityError,
    DuplicateSourceError,
    FieldError,
    NotRunningError,
    SourceDiff,
    UnknownSourceError,
    changed_fields,
    diff_sources,
)
from app.drops import DropLedger
from app.metrics import PipelineMetrics
from app.sources import create_source
from app.sources.base import FrameSource, SourceState, SourceStatus
from app.stages.detect import RegionChange
from app.stages.results import ResultsStage

logger = logging.getLogger(__name__)

REMOVE_TIMEOUT_S = 10.0
"""How long a removal waits for the decoder to end and the last frames to go through."""


class RunningSources:
    """Sources by id, with their configs; built by the pipeline, changed only through the methods below."""

    def __init__(self, configs: list[SourceConfig], *, capacity: int, batcher: Batcher,
                 statuses: queue.SimpleQueue, ledger: DropLedger, metrics: PipelineMetrics,
                 quota_for: Callable[[int], int], source_args: Mapping[str, Any],
                 stopping: threading.Event) -> None:
        self.capacity = capacity
        self._batcher = batcher
        self._statuses = statuses
        self._ledger = ledger
        self._metrics = metrics
        self._quota_for = quota_for
        self._source_args = dict(source_args)
        self._stopping = stopping
        self._results: ResultsStage | None = None
        self._sources: dict[str, FrameSource] = {}
        self._configs: dict[str, SourceConfig] = {}
        self._removing: set[str] = set()
        self._lock = threading.Lock()
        for config in configs:
            self._register(config)

    def attach(self, results: ResultsStage) -> None:
        """The results stage, once built (sources added later are registered with it)."""
        self._results = results

    # -- read-only (any thread) ----------------------------------------------
    def sources(self) -> list[FrameSource]:
        return list(self._sources.values())

    def get(self, stream_id: str) -> FrameSource | None:
        return self._sources.get(stream_id)

    def configs(self) -> dict[str, SourceConfig]:
        return dict(self._configs)

    # -- operations (one at a time) ------------------------------------------
    def add(self, config: SourceConfig) -> SourceConfig:
        """Start a new source; returns its config (with the id derived when it had none)."""
        with self._lock:
            self._check_running()
            if config.id is None:
                config = config.model_copy(update={"id": derive_source_id(config.url, len(self._configs))})
            if config.id in self._configs:
                raise DuplicateSourceError(f"source {config.id!r} exists already")
            self._check_classes(config)
            if len(self._configs) >= self.capacity:
                raise CapacityError(f"full: {self.capacity} sources run already (engine.max_sources); "
                                    f"remove one or restart with a larger engine.max_sources")
            live = config.effective_mode is SourceMode.LIVE
            self._results.add_stream(config.id, live)
            source = self._register(config)
            if config.zones or config.lines:
                self._set_regions(config)
            self._batcher.set_quota(self._quota_for(len(self._configs)))
            source.start()
            logger.info("source %s added (%s)", config.id, config.safe_url, extra={"source_id": config.id})
            return config

    def remove(self, stream_id: str, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
        """Stop one source and forget it once its last frame and its ``ended: removed`` status are out."""
        with self._lock:
            self._check_running()
            self._remove(stream_id, timeout_s)

    def update(self, stream_id: str, changes: Mapping[str, Any]) -> tuple[SourceConfig, bool]:
        """Apply ``changes`` (source fields) to one source: (its new config, whether it was restarted)."""
        with self._lock:
            self._check_running()
            old = self._known(stream_id)
            if "id" in changes and changes["id"] != stream_id:
                raise ValueError("id: a source's id cannot change (remove it and add another)")
            new = SourceConfig.model_validate({**old.model_dump(exclude_unset=True), **changes, "id": stream_id})
            self._check_classes(new)
            return new, self._apply(old, new)

    def reload(self, config: DetstreamConfig) -> SourceDiff:
        """Make the running sources those of ``config``; only the differing ones are touched."""
        with self._lock:
            self._check_running()
            diff = diff_sources(self._configs, config.sources)
            for index, new in enumerate(config.sources):
                if new.id not in self._configs or new.id in diff.changed:
                    self._check_classes(new, index)
            needed = len(self._configs) - len(diff.removed) + len(diff.added)
            if needed > self.capacity:
                raise CapacityError(f"full: the config has {needed} sources, the run holds {self.capacity} "
                                    "(engine.max_sources)")
            for stream_id in diff.removed:
                self._remove(stream_id, REMOVE_TIMEOUT_S)
            for stream_id, new in diff.changed.items():
                self._apply(self._configs[stream_id], new)
            for new in diff.added:
                self._results.add_stream(new.id, new.effective_mode is SourceMode.LIVE)
                self._register(new).start()
                if new.zones or new.lines:
                    self._set_regions(new)
            self._batcher.set_quota(self._quota_for(len(self._configs)))
            logger.info("reload: %s", diff.summary())
            return diff

    # -- internals (under the lock) --------------------------------------------
    def _register(self, config: SourceConfig) -> FrameSource:
        live = config.effective_mode is SourceMode.LIVE
        self._ledger.add_stream(config.id)
        self._batcher.add_stream(config.id, live, config.max_staleness_ms / 1e3)
        source = create_source(config, self._batcher, self._status_callback(config.id), **self._source_args)
        self._sources[config.id] = source
        self._configs[config.id] = config
        return source

    def _status_callback(self, stream_id: str) -> Callable[[SourceStatus], None]:
        def report(status: SourceStatus) -> None:
            if status.state.terminal and stream_id in self._removing:
                status = SourceStatus(stream_id, SourceState.ENDED, "removed", frames=status.frames)
            self._statuses.put(status)
        return report

    def _apply(self, old: SourceConfig, new: SourceConfig) -> bool:
        fields = changed_fields(old, new)
        if not fields:
            return False
        others = fields - ANALYTICS_FIELDS
        if not others or (others <= LIVE_FIELDS and hasattr(self._sources[old.id], "set_max_fps")):
            if others:
                self._sources[old.id].set_max_fps(new.max_fps)
                self._batcher.set_staleness(old.id, new.max_staleness_ms / 1e3)
            if fields & ANALYTICS_FIELDS:
                self._set_regions(new)
            self._configs[old.id] = new
            logger.info("source %s: %s changed in place", old.id, ", ".join(sorted(fields)))
            return False
        self._remove(old.id, REMOVE_TIMEOUT_S)
        self._results.add_stream(new.id, new.effective_mode is SourceMode.LIVE)
        self._register(new).start()
        if new.zones or new.lines:
            self._set_regions(new)
        logger.info("source %s restarted: %s changed", old.id, ", ".join(sorted(fields)))
        return True

    def _set_regions(self, config: SourceConfig) -> None:
        """Hand the source's zones and lines (or none) to the detector; the metrics series of the ones that end
        are removed on the postprocess thread, after the last event that counted into them."""
        stream_id = config.id

        def applied(ended: list[str]) -> None:
            if ended:
                _remove_region_series(self._metrics, stream_id, set(ended))
                logger.info("source %s: counts of %s ended (zones or lines removed or changed)", stream_id,
                            ", ".join(sorted(ended)))

        self._results.detector.set_regions(RegionChange(stream_id, tuple(config.zones), tuple(config.lines),
                                                        applied))

    def _check_classes(self, config: SourceConfig, index: int | None = None) -> None:
        problem = self._results.detector.analytics.check(config, index)
        if problem is not None:
            raise FieldError(*problem)

    def _remove(self, stream_id: str, timeout_s: float) -> None:
        source = self._sources[self._known(stream_id).id]
        self._removing.add(stream_id)
        deadline = time.monotonic() + timeout_s
        try:
            source.stop()
            if not source.join(timeout_s):
                logger.warning("source %s: decoder still running %.0f s after removal", stream_id, timeout_s)
            while time.monotonic() < deadline and not self._final_status_out(stream_id):
                time.sleep(0.01)
            try:
                self._batcher.remove_stream(stream_id)
            except ValueError as error:
                logger.warning("source %s removed with frames still in the pipeline: %s", stream_id, error)
            self._results.remove_stream(stream_id)
            self._ledger.forget(stream_id)
            self._metrics.remove(stream_id)
        finally:
            self._removing.discard(stream_id)
            del self._sources[stream_id]
            config = self._configs.pop(stream_id)
        if config.zones or config.lines:
            self._results.detector.set_regions(RegionChange(stream_id, (), ()))
        self._batcher.set_quota(self._quota_for(max(1, len(self._configs))))
        logger.info("source %s removed", stream_id, extra={"source_id": stream_id})

    def _final_status_out(self, stream_id: str) -> bool:
        snapshot = self._results.streams().get(stream_id)
        return (snapshot is None or snapshot.state.terminal) and self._batcher.held(stream_id) == 0

    def _known(self, stream_id: str) -> SourceConfig:
        config = self._configs.get(stream_id)
        if config is None:
            raise UnknownSourceError(f"no source {stream_id!r}")
        return config

    def _check_running(self) -> None:
        if self._results is None or self._stopping.is_set() or not self._results.alive:
            raise NotRunningError("the pipeline is not running (starting, stopping or ended)")


def _remove_region_series(metrics: PipelineMetrics, stream_id: str, names: set[str]) -> None:
    """Remove the zone and line series of ``stream_id`` whose zone or line is in ``names`` from /metrics."""
    for metric, region, label_names in ((metrics.line_crossings, "line", ("stream", "line", "direction", "label")),
                                        (metrics.zone_events, "zone", ("stream", "zone", "kind", "label")),
                                        (metrics.zone_occupancy, "zone", ("stream", "zone", "label"))):
        series = {tuple(sample.labels.get(name, "") for name in label_names)
                  for family in metric.collect() for sample in family.samples
                  if sample.labels.get("stream") == stream_id and sample.labels.get(region) in names}
        for labels in series:
            with contextlib.suppress(KeyError):  # removed meanwhile (the whole stream removed)
                metric.remove(*labels)


__all__ = ["REMOVE_TIMEOUT_S", "RunningSources"]
