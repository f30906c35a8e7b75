"""The ``zones:`` and ``lines:`` of a source: validated shapes, before any frame is seen.

What can be checked from the file alone is checked here, with the field path
in the message (``sources[0].zones[1].points: ...``): fewer than 3 points, a
self-intersecting polygon, a zero-length line, duplicate names, normalized
points outside 0..1. What needs the model or the frame is checked later, by
:mod:`app.analytics.engine`: unknown ``classes`` at pipeline start (the model's
class names), pixel points outside the frame at the stream's first frame.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.analytics.geometry import polygon_self_intersects

_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
MAX_POINTS = 64
MAX_COORD = 100_000.0


class Anchor(str, Enum):
    """Which point of a box stands for the object: the feet of a person or the wheels of a car by default."""

    BOTTOM_CENTER = "bottom_center"
    CENTER = "center"
    TOP_CENTER = "top_center"


class Units(str, Enum):
    """``pixels`` of the source frame, or ``normalized``: 0..1 of its width and height (survives a resize)."""

    PIXELS = "pixels"
    NORMALIZED = "normalized"


class _RegionConfig(BaseModel):
    """What zones and lines share."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str = Field(..., pattern=_NAME_PATTERN, max_length=64, description="unique among the source's zones "
                      "and lines; names the events and metrics")
    units: Units = Field(Units.PIXELS, description="`pixels` of the source frame or `normalized` (0..1)")
    classes: list[str] | None = Field(None, max_length=1000, description="count only these labels; default all")
    anchor: Anchor = Field(Anchor.BOTTOM_CENTER, description="the point of a box that must be inside or cross: "
                           "`bottom_center`, `center` or `top_center`")
    min_frames: int = Field(2, ge=1, le=1000, description="consecutive frames a track must stay on its new side "
                            "before it counts (a track that jitters on the edge counts once)")

    @model_validator(mode="after")
    def _normalized_range(self):
        if self.units is Units.NORMALIZED:
            outside = [list(p) for p in self.points if not (0 <= p[0] <= 1 and 0 <= p[1] <= 1)]
            if outside:
                raise ValueError(f"points: {outside[0]} is outside 0..1 (units: normalized)")
        return self


class ZoneConfig(_RegionConfig):
    """A polygon: a track is in it while its anchor point is."""

    points: list[tuple[float, float]] = Field(..., max_length=MAX_POINTS, description="polygon corners "
                                              "`[[x, y], ...]`, at least 3, edges must not cross")
    min_dwell_s: float | None = Field(None, gt=0, le=366 * 86_400.0, description="a `dwell` event when a track "
                                      "has been inside this long (once per visit)")

    @field_validator("points")
    @classmethod
    def _polygon(cls, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if len(points) < 3:
            raise ValueError(f"a zone needs at least 3 points, got {len(points)}")
        _check_range(points)
        crossing = polygon_self_intersects(points)
        if crossing is not None:
            a, b = crossing
            raise ValueError(f"polygon edges {a} and {b} cross (self-intersecting); list the corners in order "
                             "around the zone")
        return points


class LineConfig(_RegionConfig):
    """A segment: a track crosses it when its anchor moves from one side to the other across the segment."""

    points: list[tuple[float, float]] = Field(..., description="the two ends `[[x1, y1], [x2, y2]]`")
    in_side: Literal["left", "right"] = Field("right", description="the side a track enters when it crosses `in`, "
                                              "seen on screen looking from the first point to the second")

    @field_validator("points")
    @classmethod
    def _segment(cls, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if len(points) != 2:
            raise ValueError(f"a line needs exactly 2 points, got {len(points)}")
        _check_range(points)
        if points[0] == points[1]:
            raise ValueError(f"a line of length 0 ({list(points[0])} twice)")
        return points


def check_region_names(zones: list[ZoneConfig], lines: list[LineConfig]) -> None:
    """ValueError naming the first duplicate name among a source's zones and lines."""
    seen: dict[str, str] = {}
    for kind, regions in (("zones", zones), ("lines", lines)):
        for index, region in enumerate(regions):
            where = f"{kind}[{index}]"
            if region.name in seen:
                raise ValueError(f"{where}.name: duplicate name {region.name!r} (also {seen[region.name]})")
            seen[region.name] = where


def unknown_classes(source_id: str, zones: list[ZoneConfig], lines: list[LineConfig],
                    class_names: tuple[str, ...], index: int | None) -> tuple[str, str] | None:
    """``(field, message)`` for the first ``classes:`` label the model does not have, else None.

    ``field`` is ``sources[<index>].zones[<i>].classes``, or ``zones[<i>].classes`` when ``index`` is None (one
    source on its own, as the HTTP API receives it); the message starts with it.
    """
    known = set(class_names)
    prefix = "" if index is None else f"sources[{index}]."
    for kind, regions in (("zones", zones), ("lines", lines)):
        for i, region in enumerate(regions):
            missing = [c for c in region.classes or () if c not in known]
            if missing:
                close = difflib.get_close_matches(missing[0], class_names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                field = f"{prefix}{kind}[{i}].classes"
                return field, (f"{field}: unknown label(s) {missing} for this model "
                               f"(source {source_id!r}; {hint}the model has {len(class_names)} labels)")
    return None


def _check_range(points: list[tuple[float, float]]) -> None:
    for x, y in points:
        if not (-MAX_COORD <= x <= MAX_COORD and -MAX_COORD <= y <= MAX_COORD):
            raise ValueError(f"point {[x, y]} is out of range (|x|, |y| <= {MAX_COORD:g})")


__all__ = ["Anchor", "LineConfig", "Units", "ZoneConfig", "check_region_names", "unknown_classes"]
