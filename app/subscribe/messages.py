"""Typed, frozen views of the published payloads (docs/messages.md), for subscribers.

``from_payload`` validates with :func:`app.publish.messages.validate_detection`
/ :func:`~app.publish.messages.validate_status` / :func:`~app.publish.messages.validate_event`
and raises ValueError listing every problem. Keys this version does not know are kept in ``extra``, so
:meth:`to_payload` gives back what was received.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.publish.messages import LATENCY_KEYS, validate_detection, validate_event, validate_status

_DETECTION_KEYS = ("label", "class_id", "score", "box", "track_id")
_MESSAGE_KEYS = ("schema", "stream", "seq", "pts", "captured_at", "published_at", "width", "height",
                 "dropped_before", "latency_ms", "model", "engine", "detections")
_STATUS_KEYS = ("schema", "stream", "state", "reason", "attempt", "retry_in_s", "at", "frames", "dropped")
_EVENT_KEYS = ("schema", "stream", "seq", "pts", "at", "kind", "zone", "line", "direction", "reason", "track_id",
               "label", "score", "box", "counts")


def _extra(payload: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in payload.items() if key not in known}


def _checked_extra(payload: Mapping[str, Any], validate: Callable[[Any], list[str]], what: str,
                   known: tuple[str, ...]) -> dict[str, Any]:
    """The keys of a valid ``payload`` outside ``known`` (a message's ``extra``); ValueError listing every
    problem ``validate`` finds otherwise."""
    problems = validate(payload)
    if problems:
        raise ValueError(f"invalid {what} message: " + "; ".join(problems))
    return _extra(payload, known)


@dataclass(frozen=True, slots=True)
class Detection:
    """One box: ``box`` is ``(x1, y1, x2, y2)`` in pixels of the original frame."""

    label: str
    class_id: int
    score: float
    box: tuple[float, float, float, float]
    track_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_payload(cls, item: Mapping[str, Any]) -> Detection:
        x1, y1, x2, y2 = (float(v) for v in item["box"])
        return cls(item["label"], item["class_id"], float(item["score"]), (x1, y1, x2, y2), item["track_id"],
                   _extra(item, _DETECTION_KEYS))

    def to_payload(self) -> dict[str, Any]:
        return {"label": self.label, "class_id": self.class_id, "score": self.score, "box": list(self.box),
                "track_id": self.track_id, **self.extra}


@dataclass(frozen=True, slots=True)
class Latency:
    """Milliseconds spent per stage; ``total`` is capture to publish."""

    decode: float
    queue: float
    infer: float
    post: float
    total: float


@dataclass(frozen=True, slots=True)
class DetectionMessage:
    """A ``detstream.detections/1`` message: one frame of one stream."""

    stream: str
    seq: int
    pts: float | None
    captured_at: float
    published_at: float
    width: int
    height: int
    dropped_before: int
    latency_ms: Latency
    model: str
    engine: str
    detections: tuple[Detection, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> DetectionMessage:
        extra = _checked_extra(payload, validate_detection, "detection", _MESSAGE_KEYS)
        latency = Latency(*(float(payload["latency_ms"][key]) for key in LATENCY_KEYS))
        return cls(
            payload["stream"], payload["seq"], payload["pts"], float(payload["captured_at"]),
            float(payload["published_at"]), payload["width"], payload["height"], payload["dropped_before"],
            latency, payload["model"], payload["engine"],
            tuple(Detection.from_payload(item) for item in payload["detections"]), extra,
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "schema": "detstream.detections/1", "stream": self.stream, "seq": self.seq, "pts": self.pts,
            "captured_at": self.captured_at, "published_at": self.published_at, "width": self.width,
            "height": self.height, "dropped_before": self.dropped_before,
            "latency_ms": {key: getattr(self.latency_ms, key) for key in LATENCY_KEYS},
            "model": self.model, "engine": self.engine,
            "detections": [d.to_payload() for d in self.detections], **self.extra,
        }

    @property
    def analytics(self) -> Mapping[str, Any] | None:
        """The optional ``analytics`` field: ``{"zones": {zone: {label: occupancy}}, "lines": {line: {"in",
        "out"}}}`` when the source has zones or lines (docs/analytics.md), else None."""
        return self.extra.get("analytics")

    def label_counts(self) -> dict[str, int]:
        """How many boxes per label, most frequent first (ties by label)."""
        counts: dict[str, int] = {}
        for detection in self.detections:
            counts[detection.label] = counts.get(detection.label, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass(frozen=True, slots=True)
class StatusMessage:
    """A ``detstream.status/1`` message: a stream's lifecycle state (on change and as a heartbeat)."""

    stream: str
    state: str
    reason: str
    attempt: int
    retry_in_s: float | None
    at: float
    frames: int
    dropped: int
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> StatusMessage:
        extra = _checked_extra(payload, validate_status, "status", _STATUS_KEYS)
        retry = payload["retry_in_s"]
        return cls(payload["stream"], payload["state"], payload["reason"], payload["attempt"],
                   None if retry is None else float(retry), float(payload["at"]), payload["frames"],
                   payload["dropped"], extra)

    def to_payload(self) -> dict[str, Any]:
        return {"schema": "detstream.status/1", "stream": self.stream, "state": self.state, "reason": self.reason,
                "attempt": self.attempt, "retry_in_s": self.retry_in_s, "at": self.at, "frames": self.frames,
                "dropped": self.dropped, **self.extra}


@dataclass(frozen=True, slots=True)
class EventMessage:
    """A ``detstream.event/1`` message: one track entered, left or dwelt in a zone, or crossed a line.

    ``region_kind`` is ``zone`` or ``line`` (the payload's key), ``region`` its
    name; ``counts`` the region's counts right after the event.
    """

    stream: str
    seq: int
    pts: float | None
    at: float
    kind: str
    region_kind: str
    region: str
    direction: str | None
    reason: str | None
    track_id: int
    label: str
    score: float | None
    box: tuple[float, float, float, float] | None
    counts: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> EventMessage:
        extra = _checked_extra(payload, validate_event, "event", _EVENT_KEYS)
        region_kind = "zone" if isinstance(payload.get("zone"), str) else "line"
        box = payload["box"]
        return cls(payload["stream"], payload["seq"], payload["pts"], float(payload["at"]), payload["kind"],
                   region_kind, payload[region_kind], payload["direction"], payload.get("reason"),
                   payload["track_id"], payload["label"], payload["score"],
                   None if box is None else tuple(float(v) for v in box), payload["counts"], extra)

    def to_payload(self) -> dict[str, Any]:
        return {"schema": "detstream.event/1", "stream": self.stream, "seq": self.seq, "pts": self.pts,
                "at": self.at, "kind": self.kind, self.region_kind: self.region, "direction": self.direction,
                "reason": self.reason, "track_id": self.track_id, "label": self.label, "score": self.score,
                "box": None if self.box is None else list(self.box), "counts": self.counts, **self.extra}


@dataclass(frozen=True, slots=True)
class GapEvent:
    """Seqs of ``stream`` that this subscriber did not see between ``expected_seq`` and ``seq``.

    ``missing`` = ``seq - expected_seq``. The publisher reports its own drops
    in ``dropped_before``; ``explained`` is True when the two agree. An
    unexplained gap means messages were lost between publisher and
    subscriber (a full queue at a proxy or here), or the publisher broke the
    contract.
    """

    stream: str
    expected_seq: int
    seq: int
    dropped_before: int

    @property
    def missing(self) -> int:
        return self.seq - self.expected_seq

    @property
    def explained(self) -> bool:
        return self.missing == self.dropped_before


Message = DetectionMessage | StatusMessage | EventMessage
