"""Zones and lines of every stream: from each frame's tracked boxes to events and counts.

:class:`Analytics` is built once per pipeline from the config and the model's
class names (an unknown label in a ``classes:`` list is a :class:`ConfigError`
then, before any frame); :meth:`Analytics.set_stream` gives a stream new zones
and lines while it runs (a source added or changed at runtime). :meth:`Analytics.update` runs on thread
``detstream.postprocess`` right after tracking, once per frame of a stream
that has zones or lines, and returns that frame's :class:`FrameAnalytics`:
its events and every region's counts after them. The semantics (anchor point,
debounce, dwell, lost tracks) are those of :mod:`app.analytics.regions`.

Per-frame cost is one vectorised anchor, polygon and side test per region
over the frame's tracked boxes, then a few dictionary updates per track
(``lab/analytics_bench.py`` measures it). A zone remembers only tracks that
have been inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.analytics.config import LineConfig, ZoneConfig, unknown_classes
from app.analytics.geometry import anchor_points, inside_polygon, side_of_line
from app.analytics.regions import Hit, LineRegion, Shape, ZoneRegion
from app.errors import ConfigError
from app.types import Detections, FrameMeta

if TYPE_CHECKING:
    from app.config import SourceConfig

logger = logging.getLogger(__name__)

EVENT_KINDS = ("enter", "exit", "cross", "dwell")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one track in one zone or on one line.

    ``kind`` is one of :data:`EVENT_KINDS`; ``region_kind`` ``zone`` or
    ``line``. ``direction`` (``in``/``out``) is set for ``cross`` only,
    ``reason`` (``lost``) for an exit after the tracker dropped the track.
    ``box``/``score`` are the detection that caused it (the last known box is
    not kept: a lost exit has ``box`` None and ``score`` None). ``counts`` is
    the region's :meth:`Counts.as_dict` right after this event.
    """

    kind: str
    region_kind: str
    region: str
    track_id: int
    label: str
    score: float | None
    box: tuple[float, float, float, float] | None
    direction: str | None
    reason: str | None
    counts: dict


@dataclass(frozen=True, slots=True)
class FrameAnalytics:
    """One frame's analytics: its events, and each region's shape and counts after them."""

    events: tuple[Event, ...]
    shapes: tuple[Shape, ...]
    counts: dict[str, dict]

    def message_field(self) -> dict:
        """The ``analytics`` field of the frame's detection message (docs/messages.md)."""
        zones = {s.name: {label: row["occupancy"] for label, row in self.counts[s.name]["labels"].items()}
                 for s in self.shapes if s.kind == "zone"}
        lines = {s.name: {"in": self.counts[s.name]["in"], "out": self.counts[s.name]["out"]}
                 for s in self.shapes if s.kind == "line"}
        return {"zones": zones, "lines": lines}


Region = ZoneRegion | LineRegion


class StreamAnalytics:
    """The zones and lines of one stream, and the tracks they know."""

    def __init__(self, stream_id: str, regions: Sequence[Region], source_index: int = 0) -> None:
        self.stream_id = stream_id
        self.regions = list(regions)
        self._source_index = source_index
        self._size: tuple[int, int] | None = None
        self._seen: set[int] = set()
        self._anchors = sorted({r.anchor for r in self.regions})

    def _resize(self, width: int, height: int) -> None:
        self._size = (width, height)
        for region in self.regions:
            region.resize(width, height)
            outside = [p for p in region.shape.points if not (0 <= p[0] <= width and 0 <= p[1] <= height)]
            if outside:
                index = [r for r in self.regions if r.kind == region.kind].index(region)
                logger.error("sources[%d].%ss[%d].points: %s is outside the %dx%d frame of stream %r; the part "
                             "outside can never be reached", self._source_index, region.kind, index,
                             [round(v, 1) for v in outside[0]], width, height, self.stream_id)

    def update(self, dets: Detections, width: int, height: int, t: float, alive: Collection[int],
               class_names: Sequence[str]) -> list[Hit]:
        """One frame: ``t`` its time in seconds (pts, else capture time), ``alive`` the ids the tracker still
        holds (tracked or lost); tracks the engine knew that are not in it are dropped."""
        if self._size != (width, height):
            self._resize(width, height)
        hits: list[Hit] = []
        rows = np.flatnonzero(dets.track_ids >= 0)
        if len(rows):
            boxes = dets.xyxy[rows]
            ids = dets.track_ids[rows].tolist()
            labels = [class_names[c] if 0 <= c < len(class_names) else f"class{c}"
                      for c in dets.class_ids[rows].tolist()]
            anchors = {name: anchor_points(boxes, name) for name in self._anchors}
            self._seen.update(ids)
            for region in self.regions:
                points = anchors[region.anchor]
                if region.kind == "zone":
                    self._observe_zone(region, points, ids, labels, rows, t, hits)
                else:
                    self._observe_line(region, points, ids, labels, rows, hits)
        gone = self._seen.difference(alive)
        if gone:
            self._seen -= gone
            for track_id in sorted(gone):
                for region in self.regions:
                    region.drop(track_id, hits)
        return hits

    @staticmethod
    def _observe_zone(region: ZoneRegion, points: np.ndarray, ids: list[int], labels: list[str], rows: np.ndarray,
                      t: float, hits: list[Hit]) -> None:
        inside = inside_polygon(points, region.polygon).tolist()
        for i, track_id in enumerate(ids):
            if region.classes is None or labels[i] in region.classes:
                region.observe(track_id, labels[i], inside[i], t, int(rows[i]), hits)

    @staticmethod
    def _observe_line(region: LineRegion, points: np.ndarray, ids: list[int], labels: list[str], rows: np.ndarray,
                      hits: list[Hit]) -> None:
        sides = side_of_line(points, region.a, region.b).tolist()
        for i, track_id in enumerate(ids):
            if region.classes is None or labels[i] in region.classes:
                region.observe(track_id, labels[i], sides[i], (float(points[i, 0]), float(points[i, 1])),
                               int(rows[i]), hits)

    def adopt_tracks(self, previous: StreamAnalytics) -> None:
        """Take over the track ids ``previous`` (this stream before its regions changed) had seen, so that the
        regions kept from it still hear when those tracks end."""
        self._seen = set(previous._seen)

    def forget(self) -> list[Hit]:
        """The stream's tracker starts afresh (reconnect, end): every known track is lost. Counts stay."""
        hits: list[Hit] = []
        for track_id in sorted(self._seen):
            for region in self.regions:
                region.drop(track_id, hits)
        self._seen.clear()
        return hits


class Analytics:
    """Every stream's :class:`StreamAnalytics`, keyed by stream id; streams without zones or lines have none.

    Owned by thread ``detstream.postprocess``: :meth:`update`, :meth:`forget` and :meth:`set_stream` run there
    only. :meth:`counts`, :meth:`shapes`, ``in`` and :attr:`streams` are safe from any thread: the owner replaces
    its maps, never changes them in place.
    """

    def __init__(self, sources: Sequence[SourceConfig], class_names: Sequence[str]) -> None:
        self.class_names = tuple(class_names)
        self._streams: dict[str, StreamAnalytics] = {}
        self._latest: dict[str, dict[str, dict]] = {}
        for index, source in enumerate(sources):
            if not (source.zones or source.lines):
                continue
            problem = self.check(source, index)
            if problem:
                raise ConfigError(problem[1])
            self.set_stream(source.id, source.zones, source.lines, index)

    def check(self, source: SourceConfig, index: int | None = None) -> tuple[str, str] | None:
        """``(field, message)`` for a ``classes:`` label of the source's zones or lines that the model does not
        have, else None; any thread. ``index``: the source's place in ``sources:`` (None: a source on its own)."""
        return unknown_classes(source.id, source.zones, source.lines, self.class_names, index)

    def set_stream(self, stream_id: str, zones: Sequence[ZoneConfig], lines: Sequence[LineConfig],
                   source_index: int = 0) -> list[str]:
        """Give a stream these zones and lines (none: it has no analytics any more); postprocess thread only.

        A zone or line whose config is unchanged keeps its counts and the tracks it knows; a new or changed one
        starts from zero counts and learns the tracks from the next frame (no events for tracks that were in a
        changed zone). Returns the names of the stream's regions that are gone or changed, whose counts ended.
        """
        old = self._streams.get(stream_id)
        kept = {(r.kind, r.name): r for r in old.regions} if old is not None else {}
        regions: list[Region] = []
        wanted = [*((z, "zone", ZoneRegion) for z in zones), *((li, "line", LineRegion) for li in lines)]
        for config, kind, build in wanted:
            previous = kept.get((kind, config.name))
            if previous is not None and previous.config == config:
                regions.append(kept.pop((kind, config.name)))
            else:
                regions.append(build(config))
        ended = [name for _, name in kept]
        if not regions:
            self._streams = {sid: s for sid, s in self._streams.items() if sid != stream_id}
            self._latest = {sid: c for sid, c in self._latest.items() if sid != stream_id}
            return ended
        stream = StreamAnalytics(stream_id, regions, source_index)
        if old is not None:
            stream.adopt_tracks(old)
        self._streams = {**self._streams, stream_id: stream}
        self._latest = {**self._latest, stream_id: {r.name: r.counts.as_dict() for r in regions}}
        return ended

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self._streams

    @property
    def streams(self) -> list[str]:
        return list(self._streams)

    def update(self, meta: FrameMeta, dets: Detections, alive: Collection[int]) -> FrameAnalytics | None:
        """The frame's :class:`FrameAnalytics`, or None when its stream has no zones or lines."""
        stream = self._streams.get(meta.stream_id)
        if stream is None:
            return None
        t = meta.pts_s if meta.pts_s is not None else meta.captured_at
        lb = meta.letterbox
        hits = stream.update(dets, lb.src_width, lb.src_height, t, alive, self.class_names)
        return self._frame(stream, hits, dets)

    def forget(self, stream_id: str) -> FrameAnalytics | None:
        """The stream's tracks start afresh: lost exits for every track inside a zone (None without regions)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return None
        return self._frame(stream, stream.forget(), None)

    def counts(self, stream_id: str) -> dict[str, dict]:
        """Every region's counts (:meth:`Counts.as_dict`) of one stream after its last frame, by name; empty
        without regions. Safe from any thread: the postprocess thread replaces the map, never changes it."""
        return self._latest.get(stream_id, {})

    def shapes(self, stream_id: str) -> tuple[Shape, ...]:
        stream = self._streams.get(stream_id)
        return () if stream is None else tuple(r.shape for r in stream.regions)

    def _frame(self, stream: StreamAnalytics, hits: list[Hit], dets: Detections | None) -> FrameAnalytics:
        by_name = {r.name: r for r in stream.regions}
        events = []
        for hit in hits:
            region = by_name[hit.region]
            box = score = None
            if dets is not None and hit.row >= 0:
                box = tuple(round(float(v), 1) for v in dets.xyxy[hit.row])
                score = round(float(dets.scores[hit.row]), 4)
            events.append(Event(hit.kind, region.kind, hit.region, hit.track_id, hit.label, score, box,
                                hit.direction, hit.reason, hit.counts))
        counts = {r.name: r.counts.as_dict() for r in stream.regions}
        self._latest = {**self._latest, stream.stream_id: counts}
        return FrameAnalytics(tuple(events), tuple(r.shape for r in stream.regions), counts)


__all__ = ["EVENT_KINDS", "Analytics", "Event", "FrameAnalytics", "StreamAnalytics"]
