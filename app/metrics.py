"""Prometheus metrics of one pipeline, in its own registry (no process-global state).

Stages call the small methods here; rates and latencies belong in metrics,
not in logs. Frame counts (published, dropped by reason) are fed by
:class:`app.drops.DropLedger`, their one owner; latencies come from the typed
fields of each published :class:`app.types.FrameResult`. The HTTP exposition (``/metrics``, ``/healthz``, ``/readyz``)
lives in :mod:`app.health`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from app.sources.base import SourceState
from app.types import LATENCY_STAGES

if TYPE_CHECKING:
    from app.analytics.engine import Event

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)


class PipelineMetrics:
    """All counters, gauges and histograms of one pipeline run."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.frames_decoded = Counter("detstream_frames_decoded_total", "Frames admitted to the pipeline",
                                      ["stream"], registry=r)
        self.frames_published = Counter("detstream_frames_published_total", "Detection messages published",
                                        ["stream"], registry=r)
        self.frames_dropped = Counter("detstream_frames_dropped_total", "Frames decoded but never published",
                                      ["stream", "reason"], registry=r)
        self.reconnects = Counter("detstream_source_reconnects_total", "Source reconnect attempts",
                                  ["stream", "error_class"], registry=r)
        self.source_state = Gauge("detstream_source_state", "1 for the current state of each source",
                                  ["stream", "state"], registry=r)
        self.latency = Histogram("detstream_latency_seconds", "Per-frame latency by stage", ["stage"],
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.batch_size = Histogram("detstream_batch_size", "Frames per engine call",
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        self.ring_occupancy = Gauge("detstream_ring_occupancy_ratio", "Fraction of ring slots in use", registry=r)
        self.zmq_dropped = Gauge("detstream_zmq_hwm_dropped_total", "Messages dropped at the ZeroMQ high-water mark",
                                 registry=r)
        self.inference_cpu = Counter("detstream_inference_cpu_seconds_total",
                                     "CPU seconds the CPU inference workers spent running published frames",
                                     registry=r)
        self.engine_failures = Counter("detstream_engine_batch_failures_total", "Batches the engine failed on",
                                       registry=r)
        self.engine = Info("detstream_engine", "Inference backend and model", registry=r)
        self.line_crossings = Counter("detstream_line_crossings_total", "Tracks that crossed a line",
                                      ["stream", "line", "direction", "label"], registry=r)
        self.zone_events = Counter("detstream_zone_events_total", "Zone events (enter, exit, dwell)",
                                   ["stream", "zone", "kind", "label"], registry=r)
        self.zone_occupancy = Gauge("detstream_zone_occupancy", "Tracks inside a zone now",
                                    ["stream", "zone", "label"], registry=r)
        # Labelled children, looked up once: ``labels()`` sorts and validates its arguments on every call,
        # two thirds of the per-frame metrics cost (15 -> 5 us per published frame, measured).
        self._stage_latency = {stage: self.latency.labels(stage=stage) for stage in LATENCY_STAGES}
        self._decoded: dict[str, Counter] = {}
        self._published: dict[str, Counter] = {}
        self._dropped: dict[tuple[str, str], Counter] = {}

    def count_decoded(self, stream: str) -> None:
        """One frame of ``stream`` admitted to the pipeline (decoder threads)."""
        _per_stream(self._decoded, self.frames_decoded, stream).inc()

    def count_published(self, stream: str) -> None:
        """One detection message of ``stream`` published (postprocess thread, through the drop ledger)."""
        _per_stream(self._published, self.frames_published, stream).inc()

    def count_dropped(self, stream: str, reason: str, frames: int = 1) -> None:
        """``frames`` frames of ``stream`` dropped for ``reason`` (any thread, through the drop ledger)."""
        child = self._dropped.get((stream, reason))
        if child is None:
            child = self._dropped.setdefault((stream, reason), self.frames_dropped.labels(stream=stream, reason=reason))
        child.inc(frames)

    def observe_latencies(self, latencies_ms: Iterable[tuple[str, float]]) -> None:
        """One published frame's per-stage latencies, ``(stage, milliseconds)`` (postprocess thread)."""
        for stage, value_ms in latencies_ms:
            self._stage_latency[stage].observe(value_ms / 1e3)

    def count_event(self, stream: str, event: Event) -> None:
        """One zone or line event (postprocess thread); a zone's occupancy gauge follows its counts."""
        if event.region_kind == "line":
            self.line_crossings.labels(stream=stream, line=event.region, direction=event.direction or "",
                                       label=event.label).inc()
            return
        self.zone_events.labels(stream=stream, zone=event.region, kind=event.kind, label=event.label).inc()
        occupancy = event.counts["labels"].get(event.label, {}).get("occupancy", 0)
        self.zone_occupancy.labels(stream=stream, zone=event.region, label=event.label).set(occupancy)

    def remove(self, stream: str) -> None:
        """Remove every series labelled ``stream=<stream>`` (a source removed at runtime): /metrics forgets it."""
        self._decoded.pop(stream, None)
        self._published.pop(stream, None)
        for key in [key for key in self._dropped if key[0] == stream]:
            del self._dropped[key]
        for metric, names in ((self.frames_decoded, ("stream",)), (self.frames_published, ("stream",)),
                              (self.frames_dropped, ("stream", "reason")), (self.reconnects, ("stream", "error_class")),
                              (self.source_state, ("stream", "state")),
                              (self.line_crossings, ("stream", "line", "direction", "label")),
                              (self.zone_events, ("stream", "zone", "kind", "label")),
                              (self.zone_occupancy, ("stream", "zone", "label"))):
            for labels in _label_sets(metric, stream):
                with contextlib.suppress(KeyError):  # removed meanwhile (two removals of one stream)
                    metric.remove(*(labels[name] for name in names))

    def set_state(self, stream: str, state: SourceState) -> None:
        for each in SourceState:
            self.source_state.labels(stream=stream, state=each.value).set(1.0 if each is state else 0.0)


def _label_sets(metric: Counter | Gauge, stream: str) -> list[dict[str, str]]:
    """The label sets of ``metric``'s series for ``stream``, read through the public ``collect()``."""
    seen: dict[tuple, dict[str, str]] = {}
    for family in metric.collect():
        for sample in family.samples:
            if sample.labels.get("stream") == stream:
                labels = {k: v for k, v in sample.labels.items() if k != "le"}
                seen.setdefault(tuple(sorted(labels.items())), labels)
    return list(seen.values())


def _per_stream(children: dict[str, Counter], counter: Counter, stream: str) -> Counter:
    """``counter.labels(stream=stream)``, looked up once per stream and kept in ``children``."""
    child = children.get(stream)
    if child is None:
        child = children.setdefault(stream, counter.labels(stream=stream))
    return child
