"""docs/operations.md lists every metric the pipeline exports, with its labels."""

from __future__ import annotations

import re
from pathlib import Path

from app.metrics import PipelineMetrics

DOC = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()


def documented_rows() -> dict[str, str]:
    """metric name -> its table row in the Metrics section."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(detstream_[a-z_]+)` \|.*$", DOC, flags=re.M)}


def exported_names(metrics: PipelineMetrics) -> set[str]:
    suffix = {"counter": "_total", "info": "_info"}
    return {family.name + suffix.get(family.type, "") for family in metrics.registry.collect()}


def test_the_metrics_table_lists_exactly_the_exported_metrics():
    assert set(documented_rows()) == exported_names(PipelineMetrics())


def test_documented_labels_match_the_metric_definitions():
    metrics = PipelineMetrics()
    rows = documented_rows()
    for attribute in ("frames_published", "frames_dropped", "frames_decoded", "reconnects", "source_state", "latency"):
        metric = getattr(metrics, attribute)
        name = metric._name + ("_total" if metric._type == "counter" else "")
        labels = re.findall(r"`(\w+)`", rows[name].split("|")[3])
        assert labels == list(metric._labelnames), name


def test_the_health_routes_are_documented():
    for route in ("GET /metrics", "GET /healthz", "GET /readyz"):
        assert f"`{route}`" in DOC
