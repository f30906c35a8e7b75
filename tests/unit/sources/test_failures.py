"""classify() over real PyAV exceptions, raised by av.error.err_check exactly as FFmpeg reports them."""

from __future__ import annotations

import errno

import av
import pytest

from app.errors import SourceConnectionError
from app.sources.failures import FailureKind, classify

URL = "rtsp://admin:hunter2@10.0.0.5:554/stream1"


def raised(code: int) -> BaseException:
    """The exception PyAV raises for an FFmpeg return code on ``URL``."""
    try:
        av.error.err_check(code, URL)
    except Exception as exc:
        return exc
    raise AssertionError(f"err_check({code}) did not raise")


def tag(name: bytes) -> int:
    return -av.error.tag_to_code(name)


@pytest.mark.parametrize(("code", "exc_type", "kind", "retryable"), [
    (-errno.ECONNREFUSED, av.error.ConnectionRefusedError, FailureKind.REFUSED, True),
    (-errno.ETIMEDOUT, av.error.TimeoutError, FailureKind.TIMEOUT, True),
    (tag(b"EXIT"), av.error.ExitError, FailureKind.TIMEOUT, True),
    (tag(b"\xf8401"), av.error.HTTPUnauthorizedError, FailureKind.AUTH, True),
    (tag(b"\xf8403"), av.error.HTTPForbiddenError, FailureKind.AUTH, True),
    (tag(b"\xf8404"), av.error.HTTPNotFoundError, FailureKind.NOT_FOUND, True),
    (-errno.ENOENT, av.error.FileNotFoundError, FailureKind.NOT_FOUND, True),
    (tag(b"\xf8DEC"), av.error.DecoderNotFoundError, FailureKind.UNSUPPORTED_CODEC, False),
    (tag(b"PAWE"), av.error.PatchWelcomeError, FailureKind.UNSUPPORTED_CODEC, False),
    (tag(b"INDA"), av.error.InvalidDataError, FailureKind.CORRUPT, True),
    (tag(b"EOF "), av.error.EOFError, FailureKind.EOF, True),
    (-errno.ECONNRESET, av.error.ConnectionResetError, FailureKind.EOF, True),
    (-errno.EIO, av.error.OSError, FailureKind.UNKNOWN, True),
    (tag(b"\xf85XX"), av.error.HTTPServerError, FailureKind.UNKNOWN, True),
])
def test_pyav_errors_map_to_a_kind_and_a_retry_decision(code, exc_type, kind, retryable):
    exc = raised(code)
    assert isinstance(exc, exc_type)
    got_kind, got_retryable, reason = classify(exc)
    assert (got_kind, got_retryable) == (kind, retryable)
    assert reason == exc.strerror


@pytest.mark.parametrize(("message", "kind"), [
    ("method DESCRIBE failed: 401 Unauthorized", FailureKind.AUTH),
    ("Server returned 403 Forbidden (access denied)", FailureKind.AUTH),
    ("method DESCRIBE failed: 404 Not Found", FailureKind.NOT_FOUND),
    ("Connection refused", FailureKind.REFUSED),
    ("Connection timed out", FailureKind.TIMEOUT),
    ("Failed to resolve hostname cam.invalid: Name or service not known", FailureKind.DNS),
    ("Temporary failure in name resolution", FailureKind.DNS),
    ("Decoder not found", FailureKind.UNSUPPORTED_CODEC),
    ("Invalid data found when processing input", FailureKind.CORRUPT),
    ("End of file", FailureKind.EOF),
    ("something nobody has seen before", FailureKind.UNKNOWN),
])
def test_messages_map_to_a_kind(message, kind):
    assert classify(message)[0] is kind


def test_the_reason_never_carries_the_url_or_its_password():
    for code in (-errno.ECONNREFUSED, tag(b"\xf8401"), tag(b"INDA")):
        exc = raised(code)
        assert "hunter2" in str(exc), "PyAV puts the URL into str(exc): the reason must not use it"
        assert "hunter2" not in classify(exc)[2]
    reason = classify(f"cannot open {URL}\nsecond line")[2]
    assert reason == "cannot open rtsp://admin:***@10.0.0.5:554/stream1 second line"


def test_an_already_classified_source_error_keeps_its_kind():
    error = SourceConnectionError("cam: stalled, no frame for 10 s", FailureKind.TIMEOUT.value, True)
    assert classify(error)[:2] == (FailureKind.TIMEOUT, True)


def test_plain_python_os_errors_are_classified_by_errno():
    assert classify(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))[0] is FailureKind.REFUSED
    assert classify(OSError(errno.EHOSTUNREACH, "No route to host"))[0] is FailureKind.TIMEOUT
