"""The per-frame metric helpers land in the exposition a Prometheus scraper reads."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics import LATENCY_STAGES, PipelineMetrics


def _samples(metrics: PipelineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_decoded_and_published_counts_are_per_stream() -> None:
    metrics = PipelineMetrics()
    for stream in ("a", "a", "b"):
        metrics.count_decoded(stream)
    metrics.count_published("a")
    metrics.observe_latencies([("total", 20.0)])
    samples = _samples(metrics)
    assert samples[("detstream_frames_decoded_total", (("stream", "a"),))] == 2
    assert samples[("detstream_frames_decoded_total", (("stream", "b"),))] == 1
    assert samples[("detstream_frames_published_total", (("stream", "a"),))] == 1
    assert ("detstream_frames_published_total", (("stream", "b"),)) not in samples


def test_published_latencies_are_observed_in_seconds_per_stage() -> None:
    metrics = PipelineMetrics()
    metrics.observe_latencies([("decode", 2.0), ("infer", 40.0), ("total", 60.0)])
    metrics.observe_latencies([("decode", 4.0), ("infer", 30.0), ("total", 50.0)])
    samples = _samples(metrics)

    def total(stage: str) -> float:
        return samples[("detstream_latency_seconds_sum", (("stage", stage),))]

    assert total("decode") == 0.006
    assert abs(total("infer") - 0.070) < 1e-12
    assert total("total") == 0.110
    # Every stage is exposed from the start (count 0 until a frame passes), so dashboards see the series.
    assert {stage for stage in LATENCY_STAGES
            if ("detstream_latency_seconds_count", (("stage", stage),)) in samples} == set(LATENCY_STAGES)
    assert samples[("detstream_latency_seconds_count", (("stage", "queue"),))] == 0
