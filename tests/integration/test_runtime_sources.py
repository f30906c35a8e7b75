"""Sources added, changed and removed while the pipeline runs (in-process, fake engine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from app.config import SourceConfig, parse_config
from app.control import CapacityError, DuplicateSourceError, FieldError, UnknownSourceError
from app.pipeline import Pipeline
from tests.fakes import FixedEngine, MemoryPublisher


@contextmanager
def _running(clip: Path, max_sources: int = 3) -> Iterator[tuple[Pipeline, MemoryPublisher]]:
    """A started pipeline with one lossless ``steady`` source; stopped, joined and closed on the way out."""
    config = parse_config({"sources": [{"id": "steady", "url": str(clip), "loop": True, "realtime": True,
                                        "mode": "file"}],
                           "engine": {"max_batch": 4, "max_wait_ms": 2, "max_sources": max_sources},
                           "publish": {"startup_wait_s": 0}})
    publisher = MemoryPublisher()
    pipeline = Pipeline(config, engine=FixedEngine(), publisher=publisher)
    pipeline.start()
    try:
        yield pipeline, publisher
    finally:
        pipeline.stop()
        assert pipeline.wait(30)
        pipeline.close()


def _seqs_are_contiguous(publisher: MemoryPublisher, stream: str) -> bool:
    seqs = [d["seq"] for d in publisher.of(stream)]
    return seqs == list(range(len(seqs)))


def _wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_an_added_source_runs_and_a_removed_one_ends_as_removed_and_is_forgotten(small_clip):
    with _running(small_clip) as (pipeline, publisher):
        added = pipeline.add_source(SourceConfig(id="extra", url=str(small_clip), loop=True, realtime=True))
        assert added.id == "extra"
        assert _wait_until(lambda: len(publisher.of("extra")) >= 5), "the added source publishes within 10 s"
        with pytest.raises(DuplicateSourceError):
            pipeline.add_source(SourceConfig(id="extra", url=str(small_clip)))
        pipeline.add_source(SourceConfig(id="third", url=str(small_clip), loop=True, realtime=True))
        with pytest.raises(CapacityError, match=r"engine\.max_sources"):
            pipeline.add_source(SourceConfig(id="fourth", url=str(small_clip)))
        pipeline.remove_source("extra")
        final = publisher.of("extra", "statuses")[-1]
        assert final["state"] == "ended" and final["reason"] == "removed"
        assert "extra" not in pipeline.streams() and "extra" not in pipeline.source_configs()
        assert 'stream="extra"' not in generate_latest(pipeline.metrics.registry).decode()
        assert not any(t.name == "detstream.decode.extra" for t in threading.enumerate())
        with pytest.raises(UnknownSourceError):
            pipeline.remove_source("extra")
        pipeline.add_source(SourceConfig(id="extra", url=str(small_clip), loop=True, realtime=True))
        assert _wait_until(lambda: pipeline.streams().get("extra") is not None
                           and pipeline.streams()["extra"].published > 0)
    assert _seqs_are_contiguous(publisher, "steady"), "the steady (lossless) source lost no frame to the changes"


def test_max_fps_changes_without_a_restart_and_other_fields_restart_the_source(small_clip):
    with _running(small_clip) as (pipeline, publisher):
        config, restarted = pipeline.update_source("steady", {"max_fps": 5, "max_staleness_ms": 800})
        assert not restarted and config.max_fps == 5 and pipeline.source_configs()["steady"].max_staleness_ms == 800
        before = len(publisher.of("steady"))
        time.sleep(1.0)
        assert len(publisher.of("steady")) - before <= 8, "decimated to about 5 fps"
        with pytest.raises(ValueError, match="max_fps"):
            pipeline.update_source("steady", {"max_fps": -1})
        line = {"name": "door", "points": [[0, 0], [10, 10]]}
        config, restarted = pipeline.update_source("steady", {"lines": [line]})
        assert not restarted and [li.name for li in config.lines] == ["door"]
        with pytest.raises(FieldError, match=r"^lines\[0\]\.classes: unknown label\(s\) \['bus'\]") as refused:
            pipeline.add_source(SourceConfig(id="zoned", url=str(small_clip), lines=[{**line, "classes": ["bus"]}]))
        assert refused.value.field == "lines[0].classes" and "zoned" not in pipeline.source_configs()
        config, restarted = pipeline.update_source("steady", {"loop": False})
        assert restarted and pipeline.source_configs()["steady"].loop is False


ALL = {"name": "all", "points": [[0, 0], [1, 0], [1, 1], [0, 1]], "units": "normalized"}


def _metrics(pipeline: Pipeline) -> str:
    return generate_latest(pipeline.metrics.registry).decode()


def test_a_zone_replaced_at_runtime_counts_afresh_and_the_old_zones_series_are_removed(small_clip):
    """The fixed engine's box stands inside every zone here: a zone counts an ``enter`` two frames after it starts."""
    with _running(small_clip) as (pipeline, publisher):
        pipeline.add_source(SourceConfig(id="zoned", url=str(small_clip), loop=True, realtime=True, mode="file",
                                         zones=[ALL]))
        assert _wait_until(lambda: 'zone="all"' in _metrics(pipeline))
        config, restarted = pipeline.update_source("zoned", {"zones": [{**ALL, "name": "whole"}]})
        assert not restarted and config.zones[0].name == "whole"
        assert _wait_until(lambda: 'zone="whole"' in _metrics(pipeline))
        assert 'zone="all"' not in _metrics(pipeline) and 'detstream_frames_published_total{stream="zoned"}' in \
            _metrics(pipeline), "only the replaced zone's series went"
        zones = [e["zone"] for e in publisher.of("zoned", "events")]
        assert zones[0] == "all" and set(zones[zones.index("whole"):]) == {"whole"}
        assert pipeline.streams()["zoned"].counts["whole"]["in"] >= 1
    assert _seqs_are_contiguous(publisher, "zoned"), "the zone change did not restart the source"


def test_reload_applies_only_the_difference(small_clip):
    with _running(small_clip) as (pipeline, publisher):
        new = pipeline.config.model_dump(mode="json", exclude_unset=True)
        new["sources"] = [{**new["sources"][0], "max_fps": 10}, {"id": "b", "url": str(small_clip), "loop": True}]
        diff = pipeline.reload(parse_config(new))
        assert [s.id for s in diff.added] == ["b"] and not diff.removed and list(diff.changed) == ["steady"]
        assert _wait_until(lambda: len(publisher.of("b")) > 0)
        steady_statuses = [s["state"] for s in publisher.of("steady", "statuses")]
        assert "ended" not in steady_statuses, "a max_fps change does not restart the source"
        door = {"name": "door", "points": [[0, 0], [1, 1]], "units": "normalized"}
        unknown = {**new, "sources": [new["sources"][0], {**new["sources"][1], "lines": [{**door, "classes": ["x"]}]}]}
        with pytest.raises(FieldError, match=r"^sources\[1\]\.lines\[0\]\.classes: unknown label"):
            pipeline.reload(parse_config(unknown))
        diff = pipeline.reload(parse_config({**new, "sources": [new["sources"][0], {**new["sources"][1],
                                                                                      "zones": [ALL]}]}))
        assert list(diff.changed) == ["b"] and not diff.added and not diff.removed
        assert "ended" not in [s["state"] for s in publisher.of("b", "statuses")], "zones change in place"
        new["sources"] = new["sources"][1:]
        diff = pipeline.reload(parse_config(new))
        assert diff.removed == ["steady"] and not diff.added
        assert publisher.of("steady", "statuses")[-1]["reason"] == "removed"
