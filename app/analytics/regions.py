"""One zone or line of one stream: its shape in frame pixels, its per-track state and its counts.

The debounce, the same for both: a track's confirmed state (inside or
outside a zone; its side of a line) changes only after ``min_frames``
consecutive observations of the other state, so a box that jitters on an edge
changes nothing. Frames a track is not detected in are not observations.

* Zone: ``enter`` when the change is to inside, ``exit`` when to outside;
  ``dwell`` once per visit when the track has been inside ``min_dwell_s``,
  timed from the first frame of the streak that entered. A track the tracker
  drops while inside leaves with ``exit``, ``reason: lost``.
* Line: a change of side is a crossing only when the anchor's move that
  started it (from its last point on the old side to its first on the new)
  passes through the segment itself, not the line's extension beyond an end.
  ``in`` is a crossing onto ``in_side``. A point exactly on the line is no
  observation.

Runs on thread ``detstream.postprocess``; one owner, not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.analytics.config import LineConfig, Units, ZoneConfig
from app.analytics.geometry import segments_intersect

Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Shape:
    """A zone or line as drawn on one frame size: name, ``kind`` (``zone``/``line``) and frame-pixel points.

    ``in_sign`` (lines): +1 when ``in`` is right of first→second point as seen on screen, -1 when left.
    """

    name: str
    kind: str
    points: tuple[Point, ...]
    in_sign: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    """What a region reports for one track on one frame (turned into an event by the engine)."""

    kind: str            # enter | exit | cross | dwell
    region: str
    track_id: int
    label: str
    row: int             # the detection's row in this frame's Detections, -1 for a lost track
    counts: dict
    direction: str | None = None
    reason: str | None = None


class Counts:
    """Cumulative ``in``/``out`` and current ``occupancy`` per label, since the start of the run."""

    __slots__ = ("_snapshot", "by_label", "zone")

    def __init__(self, zone: bool) -> None:
        self.zone = zone
        self.by_label: dict[str, list[int]] = {}
        self._snapshot: dict | None = None

    def add(self, label: str, d_in: int = 0, d_out: int = 0, d_occupancy: int = 0) -> None:
        row = self.by_label.setdefault(label, [0, 0, 0])
        row[0] += d_in
        row[1] += d_out
        row[2] += d_occupancy
        self._snapshot = None

    def as_dict(self) -> dict:
        """``{"in", "out", ["occupancy",] "labels": {label: {...}}}``: totals and per label (``occupancy`` for
        zones only). The same object until the counts change again: treat it as read-only."""
        if self._snapshot is None:
            keys = ("in", "out", "occupancy") if self.zone else ("in", "out")
            labels = {label: dict(zip(keys, row, strict=False)) for label, row in self.by_label.items()}
            totals = {key: sum(row[i] for row in self.by_label.values()) for i, key in enumerate(keys)}
            self._snapshot = {**totals, "labels": labels}
        return self._snapshot


def _pixels(points: list[Point], units: Units, width: int, height: int) -> tuple[Point, ...]:
    if units is Units.NORMALIZED:
        return tuple((x * width, y * height) for x, y in points)
    return tuple((float(x), float(y)) for x, y in points)


@dataclass(slots=True)
class _ZoneTrack:
    label: str
    inside: bool = False
    streak: int = 0
    t_streak: float = 0.0
    t_enter: float = 0.0
    dwelt: bool = False


class ZoneRegion:
    """One zone of one stream."""

    kind = "zone"

    def __init__(self, config: ZoneConfig) -> None:
        self.config = config
        self.name = config.name
        self.anchor = config.anchor.value
        self.classes = frozenset(config.classes) if config.classes else None
        self.counts = Counts(zone=True)
        self.shape = Shape(self.name, "zone", ())
        self.polygon = np.zeros((0, 2))
        self._tracks: dict[int, _ZoneTrack] = {}

    def resize(self, width: int, height: int) -> None:
        """Place the zone on a frame of this size (at the first frame, and when a stream changes resolution)."""
        self.shape = Shape(self.name, "zone", _pixels(self.config.points, self.config.units, width, height))
        self.polygon = np.asarray(self.shape.points, dtype=np.float64)

    def observe(self, track_id: int, label: str, inside: bool, t: float, row: int, hits: list[Hit]) -> None:
        """One frame's observation of one track (inside or not)."""
        track = self._tracks.get(track_id)
        if track is None:
            if not inside:
                return  # outside and never seen inside: nothing to remember
            track = self._tracks[track_id] = _ZoneTrack(label)
        min_frames = self.config.min_frames
        if inside != track.inside:
            if track.streak == 0:
                track.t_streak = t
            track.streak += 1
            if track.streak < min_frames:
                return
            track.inside, track.streak = inside, 0
            if inside:
                track.label, track.t_enter, track.dwelt = label, track.t_streak, False
                self.counts.add(label, d_in=1, d_occupancy=1)
                hits.append(Hit("enter", self.name, track_id, label, row, self.counts.as_dict()))
            else:
                self.counts.add(track.label, d_out=1, d_occupancy=-1)
                hits.append(Hit("exit", self.name, track_id, track.label, row, self.counts.as_dict()))
                del self._tracks[track_id]
                return
        else:
            track.streak = 0
        dwell_s = self.config.min_dwell_s
        if track.inside and dwell_s is not None and not track.dwelt and t - track.t_enter >= dwell_s:
            track.dwelt = True
            hits.append(Hit("dwell", self.name, track_id, track.label, row, self.counts.as_dict()))

    def drop(self, track_id: int, hits: list[Hit]) -> None:
        """The tracker no longer has this track: it leaves (``reason: lost``) if it was inside."""
        track = self._tracks.pop(track_id, None)
        if track is not None and track.inside:
            self.counts.add(track.label, d_out=1, d_occupancy=-1)
            hits.append(Hit("exit", self.name, track_id, track.label, -1, self.counts.as_dict(), reason="lost"))


@dataclass(slots=True)
class _LineTrack:
    side: int
    last: Point
    streak: int = 0
    crossed: bool = False


class LineRegion:
    """One line of one stream."""

    kind = "line"

    def __init__(self, config: LineConfig) -> None:
        self.config = config
        self.name = config.name
        self.anchor = config.anchor.value
        self.classes = frozenset(config.classes) if config.classes else None
        self.counts = Counts(zone=False)
        self.in_sign = 1 if config.in_side == "right" else -1
        self.shape = Shape(self.name, "line", (), self.in_sign)
        self.a: Point = (0.0, 0.0)
        self.b: Point = (0.0, 0.0)
        self._tracks: dict[int, _LineTrack] = {}

    def resize(self, width: int, height: int) -> None:
        self.shape = Shape(self.name, "line", _pixels(self.config.points, self.config.units, width, height),
                           self.in_sign)
        self.a, self.b = self.shape.points

    def observe(self, track_id: int, label: str, side: int, point: Point, row: int, hits: list[Hit]) -> None:
        """One frame's observation: the track's anchor ``point`` and its ``side`` (+1 right, -1 left, 0 on)."""
        track = self._tracks.get(track_id)
        if track is None:
            if side:
                self._tracks[track_id] = _LineTrack(side, point)
            return
        if side == 0:
            return
        if side == track.side:
            track.streak, track.last = 0, point
            return
        if track.streak == 0:
            track.crossed = segments_intersect(track.last, point, self.a, self.b)
        track.streak += 1
        if track.streak < self.config.min_frames:
            return
        track.side, track.streak, track.last = side, 0, point
        if track.crossed:
            inward = side == self.in_sign
            self.counts.add(label, d_in=int(inward), d_out=int(not inward))
            hits.append(Hit("cross", self.name, track_id, label, row, self.counts.as_dict(),
                            direction="in" if inward else "out"))

    def drop(self, track_id: int, hits: list[Hit]) -> None:
        self._tracks.pop(track_id, None)


__all__ = ["Counts", "Hit", "LineRegion", "Shape", "ZoneRegion"]
