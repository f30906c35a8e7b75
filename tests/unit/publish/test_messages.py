"""Payload building, encodings, validation and the robustness of decode()."""

from __future__ import annotations

import contextlib
import json

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.publish.messages import (
    MessageDecodeError,
    decode,
    det_topic,
    detection_payload,
    encode,
    status_payload,
    status_topic,
    validate_detection,
    validate_status,
)
from app.types import Detections, FrameMeta, FrameResult, Letterbox

NAMES = ("person", "car")


def frame_result(pts_s: float | None = 49.36) -> FrameResult:
    meta = FrameMeta(stream_id="gate", seq=1234, pts_s=pts_s, captured_at=1763770000.123456789, t_captured=100.0,
                     decode_ms=1.234, letterbox=Letterbox(0.5, 0, 40, 768, 576), dropped_before=0)
    detections = Detections(
        np.array([[10.04, 20.06, 100.55, 200.0], [0, 0, 768, 576], [5, 5, 6, 6]], np.float32),
        np.array([0.934567, 0.5, 0.3], np.float32),
        np.array([0, 1, 7], np.int32),
        np.array([-1, 42, -1], np.int64),
    )
    return FrameResult(meta, detections, queue_ms=3.04, infer_ms=28.55, post_ms=0.94)


def payload(**overrides):
    options = {"model": "yolov3-tiny", "engine": "onnxruntime:CPUExecutionProvider", "published_at": 1763770000.171,
               "dropped_before": 2, "class_names": NAMES, "now_monotonic": 100.048}
    options.update(overrides)
    return detection_payload(frame_result(options.pop("pts_s", 49.36)), **options)


def status(**overrides):
    args = {"stream_id": "gate", "state": "reconnecting", "reason": "rtsp://admin:hunter2@10.0.0.5/s1 refused",
            "attempt": 3, "retry_in_s": 4.0, "frames": 1234, "dropped": 5, "at": 1763770000.0}
    args.update(overrides)
    return status_payload(**args)


def test_detection_payload_has_exactly_the_contract_fields_and_validates():
    p = payload()
    assert list(p) == ["schema", "stream", "seq", "pts", "captured_at", "published_at", "width", "height",
                       "dropped_before", "latency_ms", "model", "engine", "detections"]
    assert validate_detection(p) == []
    assert p["schema"] == "detstream.detections/1" and p["stream"] == "gate" and p["seq"] == 1234
    assert (p["width"], p["height"], p["dropped_before"]) == (768, 576, 2)
    assert p["latency_ms"] == {"decode": 1.2, "queue": 3.0, "infer": 28.6, "post": 0.9, "total": 48.0}


def test_detections_are_rounded_labelled_and_untracked_ids_are_null():
    first, second, third = payload()["detections"]
    assert first == {"label": "person", "class_id": 0, "score": 0.9346, "box": [10.0, 20.1, 100.6, 200.0],
                     "track_id": None}
    assert second["label"] == "car" and second["track_id"] == 42 and second["box"] == [0.0, 0.0, 768.0, 576.0]
    assert third["label"] == "class7"  # a class id the names do not cover still gets a label


def test_pts_may_be_null():
    p = payload(pts_s=None)
    assert p["pts"] is None and validate_detection(p) == []


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_both_encodings_carry_equal_content(encoding):
    p = payload()
    assert decode(encode(p, encoding), encoding) == p
    s = status()
    assert decode(encode(s, encoding), encoding) == s


def test_json_is_compact_utf8_and_msgpack_is_a_plain_map():
    p = payload()
    assert encode(p, "json").startswith(b'{"schema":"detstream.detections/1"')
    assert msgpack.unpackb(encode(p, "msgpack"), raw=False) == json.loads(encode(p, "json"))


def test_status_reason_never_contains_the_password():
    s = status()
    assert "hunter2" not in s["reason"] and "rtsp://admin:***@10.0.0.5/s1" in s["reason"]
    assert validate_status(s) == []
    assert list(s) == ["schema", "stream", "state", "reason", "attempt", "retry_in_s", "at", "frames", "dropped"]


def test_status_with_no_retry_scheduled_has_null_retry():
    s = status(state="running", reason=None, retry_in_s=None, attempt=0)
    assert s["retry_in_s"] is None and s["reason"] == "" and validate_status(s) == []


def test_status_rejects_an_unknown_state():
    with pytest.raises(ValueError, match="paused"):
        status(state="paused")


def test_topics_end_with_a_slash_so_prefixes_are_exact():
    assert det_topic("cam1") == b"det/cam1/" and status_topic("cam1") == b"status/cam1/"
    assert not det_topic("cam10").startswith(det_topic("cam1"))


def with_change(path: str, value):
    p = payload()
    target = p
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return p


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("schema", "detstream.detections/2", "schema"),
        ("seq", KeyError, "seq: missing"),
        ("seq", True, "seq"),
        ("seq", -1, "seq"),
        ("stream", "a/b", "stream"),
        ("width", 0, "width"),
        ("captured_at", float("nan"), "captured_at"),
        ("captured_at", 10**400, "captured_at"),  # a JSON int beyond float range: a problem, not OverflowError
        ("latency_ms", {"decode": -(10**400), "queue": 1, "infer": 1, "post": 1, "total": 1}, "latency_ms"),
        ("latency_ms", {"decode": 1}, "latency_ms"),
        ("detections", {}, "detections"),
        ("detections.0.box", [10, 20, 10, 30], "x1 < x2"),
        ("detections.0.box", [10, 20, 30], "detections[0].box"),
        ("detections.0.box", [10, 20, 800, 30], "outside the 768x576 frame"),
        ("detections.0.score", 1.5, "detections[0].score"),
        ("detections.0.track_id", "7", "detections[0].track_id"),
        ("detections.1.label", KeyError, "detections[1].label: missing"),
    ],
)
def test_validator_names_each_problem(path, value, problem):
    problems = validate_detection(with_change(path, value))
    assert problems and any(problem in p for p in problems), problems


def test_a_status_with_a_number_beyond_float_range_is_a_problem_not_an_overflow():
    assert validate_status(status() | {"retry_in_s": 10**400}) != []


def test_validators_allow_unknown_keys_and_refuse_non_maps():
    assert validate_detection(payload() | {"future_field": 1}) == []
    assert validate_detection([1, 2]) == ["payload: expected a map, got list"]
    assert validate_status(status() | {"attempt": "3"}) != []


def test_json_encoding_refuses_nan_instead_of_writing_invalid_json():
    with pytest.raises(ValueError):
        encode({"x": float("nan")}, "json")


@pytest.mark.parametrize(
    ("data", "encoding"),
    [
        (b"", "json"),
        (b"[1, 2]", "json"),
        (b"\xff\xfe", "json"),
        (b"[" * 100000, "json"),
        (msgpack.packb([1, 2]), "msgpack"),
        (msgpack.packb({"a": 1}) + b"\x00", "msgpack"),
        (msgpack.packb(msgpack.ExtType(5, b"x")), "msgpack"),
        (b"\xc1", "msgpack"),
        (b"\x81", "msgpack"),
        (b"{}", "pickle"),
    ],
)
def test_decode_refuses_malformed_payloads_with_a_value_error(data, encoding):
    with pytest.raises(MessageDecodeError):
        decode(data, encoding)


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.binary(max_size=512), encoding=st.sampled_from(["json", "msgpack"]))
def test_decode_of_random_bytes_returns_a_map_or_raises_only_a_clean_value_error(data, encoding):
    try:
        result = decode(data, encoding)
    except MessageDecodeError:
        return
    assert isinstance(result, dict)


@settings(max_examples=200, deadline=None, database=None)
@given(prefix=st.binary(max_size=64), encoding=st.sampled_from(["json", "msgpack"]))
def test_decode_of_a_corrupted_real_payload_raises_only_a_clean_value_error(prefix, encoding):
    real = encode(payload(), encoding)
    corrupted = prefix + real[len(prefix):]
    with contextlib.suppress(MessageDecodeError):  # anything else fails the test
        decode(corrupted, encoding)
