"""The published messages: topics, payload building, encoding and schema checks (docs/messages.md).

Two frames per message: the topic (``det/<stream_id>/``, ``status/<stream_id>/`` or ``event/<stream_id>/``;
the trailing slash makes a ZeroMQ prefix subscription exact) and the payload,
a map encoded as JSON (UTF-8) or msgpack. Payloads are plain data: decoding
never runs code (no pickle, no msgpack extension types) and has size limits,
so a subscriber can read from untrusted publishers.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgpack

from app.analytics.engine import EVENT_KINDS
from app.redact import redact_url
from app.sources.base import SourceState
from app.types import LATENCY_STAGES, FrameResult

if TYPE_CHECKING:
    from app.analytics.engine import Event

DETECTION_SCHEMA = "detstream.detections/1"
STATUS_SCHEMA = "detstream.status/1"
EVENT_SCHEMA = "detstream.event/1"
STATES = tuple(state.value for state in SourceState)
"""The ``state`` values of a status message: those of :class:`app.sources.base.SourceState`."""
LATENCY_KEYS = LATENCY_STAGES
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
"""Larger payloads are refused by :func:`decode` (a frame with 300 boxes is about 30 kB)."""

Encoding = Literal["json", "msgpack"]
_STREAM_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


class MessageDecodeError(ValueError):
    """Bytes that are not a well-formed payload map in the expected encoding."""


def det_topic(stream_id: str) -> bytes:
    """``b"det/<stream_id>/"``: the topic frame of a detection message."""
    return f"det/{stream_id}/".encode()


def status_topic(stream_id: str) -> bytes:
    """``b"status/<stream_id>/"``: the topic frame of a status message."""
    return f"status/{stream_id}/".encode()


def event_topic(stream_id: str) -> bytes:
    """``b"event/<stream_id>/"``: the topic frame of a zone or line event."""
    return f"event/{stream_id}/".encode()


def _ms(value: float) -> float:
    return round(max(float(value), 0.0), 1)


def _label(class_names: Sequence[str], class_id: int) -> str:
    return class_names[class_id] if 0 <= class_id < len(class_names) else f"class{class_id}"


def detection_payload(
    result: FrameResult,
    *,
    model: str,
    engine: str,
    published_at: float,
    dropped_before: int,
    class_names: Sequence[str],
    now_monotonic: float | None = None,
) -> dict[str, Any]:
    """The ``detstream.detections/1`` map for one frame.

    ``published_at`` is wall-clock epoch seconds. ``latency_ms.total`` is
    measured on the monotonic clock, from ``meta.t_captured`` to
    ``now_monotonic`` (default: ``time.monotonic()`` now), so a wall-clock step
    never makes it negative. Boxes are rounded to 0.1 px, scores to 4 decimals,
    latencies to 0.1 ms; ``track_id`` is null for untracked boxes. The
    optional ``analytics`` field (a source with zones or lines) is added when
    the result has it.
    """
    meta = result.meta
    dets = result.detections
    now = time.monotonic() if now_monotonic is None else now_monotonic
    boxes = [[round(float(v), 1) for v in row] for row in dets.xyxy.tolist()]
    detections = [
        {
            "label": _label(class_names, int(class_id)),
            "class_id": int(class_id),
            "score": round(float(score), 4),
            "box": box,
            "track_id": None if track_id < 0 else int(track_id),
        }
        for box, score, class_id, track_id in zip(
            boxes, dets.scores.tolist(), dets.class_ids.tolist(), dets.track_ids.tolist(), strict=True
        )
    ]
    payload = {
        "schema": DETECTION_SCHEMA,
        "stream": meta.stream_id,
        "seq": int(meta.seq),
        "pts": None if meta.pts_s is None else round(float(meta.pts_s), 6),
        "captured_at": round(float(meta.captured_at), 6),
        "published_at": round(float(published_at), 6),
        "width": int(meta.letterbox.src_width),
        "height": int(meta.letterbox.src_height),
        "dropped_before": int(dropped_before),
        "latency_ms": {
            "decode": _ms(meta.decode_ms),
            "queue": _ms(result.queue_ms),
            "infer": _ms(result.infer_ms),
            "post": _ms(result.post_ms),
            "total": _ms((now - meta.t_captured) * 1000.0),
        },
        "model": model,
        "engine": engine,
        "detections": detections,
    }
    if result.analytics is not None:
        payload["analytics"] = result.analytics.message_field()
    return payload


def event_payload(stream_id: str, event: Event, *, seq: int, pts: float | None, at: float) -> dict[str, Any]:
    """The ``detstream.event/1`` map of one zone or line event; ``seq``/``pts`` of the frame it happened on."""
    return {
        "schema": EVENT_SCHEMA,
        "stream": stream_id,
        "seq": int(seq),
        "pts": None if pts is None else round(float(pts), 6),
        "at": round(float(at), 6),
        "kind": event.kind,
        event.region_kind: event.region,
        "direction": event.direction,
        "reason": event.reason,
        "track_id": int(event.track_id),
        "label": event.label,
        "score": event.score,
        "box": None if event.box is None else list(event.box),
        "counts": event.counts,
    }


def status_payload(
    stream_id: str,
    state: str,
    reason: str | None,
    attempt: int,
    retry_in_s: float | None,
    frames: int,
    dropped: int,
    at: float,
) -> dict[str, Any]:
    """The ``detstream.status/1`` map; ``reason`` has URL credentials masked.

    ``state`` is one of :data:`STATES` (else ValueError). ``retry_in_s`` is
    null when no retry is scheduled; ``at`` is wall-clock epoch seconds.
    """
    if state not in STATES:
        raise ValueError(f"status state {state!r} is not one of {', '.join(STATES)}")
    return {
        "schema": STATUS_SCHEMA,
        "stream": stream_id,
        "state": state,
        "reason": redact_url(reason or ""),
        "attempt": int(attempt),
        "retry_in_s": None if retry_in_s is None else round(float(retry_in_s), 3),
        "at": round(float(at), 6),
        "frames": int(frames),
        "dropped": int(dropped),
    }


def encode(payload: Mapping[str, Any], encoding: Encoding) -> bytes:
    """Serialise a payload map. JSON is compact UTF-8 and refuses NaN/Infinity (ValueError)."""
    if encoding == "json":
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if encoding == "msgpack":
        return msgpack.packb(payload, use_bin_type=True)
    raise ValueError(f"unknown encoding {encoding!r} (use json or msgpack)")


def _refuse_ext(code: int, data: bytes) -> Any:
    raise MessageDecodeError(f"msgpack extension type {code} is not allowed in a payload")


def decode(data: bytes, encoding: Encoding) -> dict[str, Any]:
    """Parse a payload map; any malformed input raises :class:`MessageDecodeError` (a ValueError)."""
    if len(data) > MAX_PAYLOAD_BYTES:
        raise MessageDecodeError(f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        if encoding == "json":
            value = json.loads(bytes(data).decode("utf-8"))
        elif encoding == "msgpack":
            value = msgpack.unpackb(
                bytes(data), raw=False, strict_map_key=True, ext_hook=_refuse_ext, use_list=True
            )  # unpackb caps every string, list and map length at len(data)
        else:
            raise MessageDecodeError(f"unknown encoding {encoding!r} (use json or msgpack)")
    except MessageDecodeError:
        raise
    except (ValueError, RecursionError, msgpack.UnpackException) as error:
        raise MessageDecodeError(f"not a valid {encoding} payload: {error}") from None
    if not isinstance(value, dict):
        raise MessageDecodeError(f"payload is a {type(value).__name__}, expected a map")
    return value


def shorten_repr(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite int or float that also fits a float (JSON ints are unbounded: 10**400 would overflow later)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


Check = tuple[Callable[[Any], bool], str]
"""A field's test and what it wants, for the problem text: ``(test, "an integer >= 0")``."""

_STRING: Check = (lambda v: isinstance(v, str), "a string")
_COUNT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
_SIZE: Check = (lambda v: _is_int(v) and v > 0, "an integer > 0")
_EPOCH: Check = (_is_number, "epoch seconds")
_PTS: Check = (lambda v: v is None or _is_number(v), "a number or null")


def _check_fields(payload: Mapping[str, Any], checks: Mapping[str, Check]) -> list[str]:
    problems = []
    for key, (check, wanted) in checks.items():
        if key not in payload:
            problems.append(f"{key}: missing")
        elif not check(payload[key]):
            problems.append(f"{key}: expected {wanted}, got {payload[key]!r}")
    return problems


def _check_map(payload: Any, checks: Mapping[str, Check],
               more: Callable[[Mapping[str, Any]], list[str]] | None = None) -> list[str]:
    """The problems of a payload that must be a map with ``checks``' keys; ``more`` adds those no single
    field shows (a map only)."""
    if not isinstance(payload, Mapping):
        return [f"payload: expected a map, got {type(payload).__name__}"]
    problems = _check_fields(payload, checks)
    return problems + more(payload) if more is not None else problems


def _common_checks(schema: str) -> dict[str, Check]:
    return {
        "schema": (lambda v: v == schema, repr(schema)),
        "stream": (lambda v: isinstance(v, str) and bool(_STREAM_ID.match(v)), "a stream id [A-Za-z0-9_.-]+"),
    }


def _check_box(index: int, box: Any, width: Any, height: Any) -> list[str]:
    where = f"detections[{index}].box"
    if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
        return [f"{where}: expected [x1, y1, x2, y2] numbers, got {box!r}"]
    x1, y1, x2, y2 = box
    problems = [] if x1 < x2 and y1 < y2 else [f"{where}: expected x1 < x2 and y1 < y2, got {box!r}"]
    if _is_int(width) and _is_int(height) and not (x1 >= 0 and y1 >= 0 and x2 <= width and y2 <= height):
        problems.append(f"{where}: {box!r} is outside the {width}x{height} frame")
    return problems


_BOX_CHECKS: Mapping[str, Check] = {
    "label": _STRING,
    "class_id": _COUNT,
    "score": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "track_id": (lambda v: v is None or _is_int(v), "an integer or null"),
    "box": (lambda v: True, ""),
}


def _check_detection(index: int, item: Any, width: Any, height: Any) -> list[str]:
    if not isinstance(item, dict):
        return [f"detections[{index}]: expected a map, got {item!r}"]
    problems = [f"detections[{index}].{p}" for p in _check_fields(item, _BOX_CHECKS)]
    if "box" in item:
        problems += _check_box(index, item["box"], width, height)
    return problems


_DETECTION_CHECKS: Mapping[str, Check] = _common_checks(DETECTION_SCHEMA) | {
    "seq": _COUNT,
    "pts": _PTS,
    "captured_at": _EPOCH,
    "published_at": _EPOCH,
    "width": _SIZE,
    "height": _SIZE,
    "dropped_before": _COUNT,
    "latency_ms": (
        lambda v: isinstance(v, dict) and all(_is_number(v.get(k)) and v[k] >= 0 for k in LATENCY_KEYS),
        "a map of " + ", ".join(LATENCY_KEYS) + " (ms >= 0)",
    ),
    "model": _STRING,
    "engine": _STRING,
    "detections": (lambda v: isinstance(v, list), "a list"),
}


def _check_analytics_and_boxes(payload: Mapping[str, Any]) -> list[str]:
    problems = []
    analytics = payload.get("analytics")
    if analytics is not None and not (isinstance(analytics, dict) and isinstance(analytics.get("zones"), dict)):
        problems.append(f"analytics: expected a map with zones, got {shorten_repr(analytics)}")
    if isinstance(payload.get("detections"), list):
        width, height = payload.get("width"), payload.get("height")
        for index, item in enumerate(payload["detections"]):
            problems += _check_detection(index, item, width, height)
    return problems


def validate_detection(payload: Any) -> list[str]:
    """Problems that keep ``payload`` from being a ``detstream.detections/1`` map; empty when valid.

    Unknown keys are allowed (additions to the schema are not breaking).
    """
    return _check_map(payload, _DETECTION_CHECKS, _check_analytics_and_boxes)


_STATUS_CHECKS: Mapping[str, Check] = _common_checks(STATUS_SCHEMA) | {
    "state": (lambda v: v in STATES, " | ".join(STATES)),
    "reason": _STRING,
    "attempt": _COUNT,
    "retry_in_s": (lambda v: v is None or (_is_number(v) and v >= 0), "seconds >= 0 or null"),
    "at": _EPOCH,
    "frames": _COUNT,
    "dropped": _COUNT,
}


def validate_status(payload: Any) -> list[str]:
    """Problems that keep ``payload`` from being a ``detstream.status/1`` map; empty when valid."""
    return _check_map(payload, _STATUS_CHECKS)


def _is_counts(value: Any) -> bool:
    return (isinstance(value, dict) and _is_int(value.get("in")) and _is_int(value.get("out"))
            and isinstance(value.get("labels"), dict))


_EVENT_CHECKS: Mapping[str, Check] = _common_checks(EVENT_SCHEMA) | {
    "seq": _COUNT,
    "pts": _PTS,
    "at": _EPOCH,
    "kind": (lambda v: v in EVENT_KINDS, " | ".join(EVENT_KINDS)),
    "direction": (lambda v: v in (None, "in", "out"), "in, out or null"),
    "track_id": (_is_int, "an integer"),
    "label": _STRING,
    "score": (lambda v: v is None or (_is_number(v) and 0 <= v <= 1), "a number in [0, 1] or null"),
    "box": (lambda v: v is None or (isinstance(v, list) and len(v) == 4 and all(_is_number(x) for x in v)),
            "[x1, y1, x2, y2] or null"),
    "counts": (_is_counts, "a map of in, out (and occupancy) and labels"),
}


def _check_region(payload: Mapping[str, Any]) -> list[str]:
    regions = [key for key in ("zone", "line") if isinstance(payload.get(key), str)]
    if len(regions) != 1:
        return [f"zone/line: expected exactly one of them as a string, got {regions or 'neither'}"]
    return []


def validate_event(payload: Any) -> list[str]:
    """Problems that keep ``payload`` from being a ``detstream.event/1`` map; empty when valid."""
    return _check_map(payload, _EVENT_CHECKS, _check_region)
