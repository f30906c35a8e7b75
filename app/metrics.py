"""Prometheus metrics of one pipeline, in its own registry (no process-global state).

Stages call the small methods here; rates and latencies belong in metrics,
not in logs. The HTTP exposition (``/metrics``, ``/healthz``, ``/readyz``)
lives in :mod:`app.health`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
STATES = ("connecting", "running", "reconnecting", "ended", "failed")


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
        self.engine_failures = Counter("detstream_engine_batch_failures_total", "Batches the engine failed on",
                                       registry=r)
        self.engine = Info("detstream_engine", "Inference backend and model", registry=r)

    def set_state(self, stream: str, state: str) -> None:
        for name in STATES:
            self.source_state.labels(stream=stream, state=name).set(1.0 if name == state else 0.0)
