"""Why a source failed, in one word an operator (and the reconnect loop) can act on.

:func:`classify` maps a PyAV/FFmpeg exception (or a message) to a
:class:`FailureKind`, whether reconnecting can help, and a one-line reason.
The reason never contains the URL: PyAV puts the filename (with any
``user:password@``) into ``str(exc)``, so only ``strerror`` is used, and the
result is passed through :func:`app.redact.redact_url` as a second guard.

Whether a source actually retries also depends on its kind: network sources
retry every ``retryable`` failure; files never retry (they end ``failed``).
"""

from __future__ import annotations

import errno as errno_codes
from enum import StrEnum

import av

from app.redact import redact_url


class FailureKind(StrEnum):
    """Failure classes: the word after the URL in a status ``reason``, and the retry decision.

    ``SourceStatus.error_kind`` carries it in process (metrics label ``error_class``); the published
    status payload has no field of its own for it.
    """

    REFUSED = "refused"                    # nothing listening (TCP RST)
    TIMEOUT = "timeout"                    # no answer / no data in time, stalled stream
    DNS = "dns"                            # host name does not resolve
    AUTH = "auth"                          # 401/403: wrong or missing credentials
    NOT_FOUND = "not_found"                # 404 / no such file / no such RTSP path
    UNSUPPORTED_CODEC = "unsupported_codec"  # no decoder for the stream
    CORRUPT = "corrupt"                    # not a video, garbage, truncated
    EOF = "eof"                            # the server or file ended the stream
    UNKNOWN = "unknown"


# Could reconnecting (later, with the same settings) help? Auth is retried: cameras
# answer 401 while booting, and credentials can be fixed on the camera side.
RETRYABLE = {
    FailureKind.REFUSED: True,
    FailureKind.TIMEOUT: True,
    FailureKind.DNS: True,
    FailureKind.AUTH: True,
    FailureKind.NOT_FOUND: True,
    FailureKind.UNSUPPORTED_CODEC: False,
    FailureKind.CORRUPT: True,
    FailureKind.EOF: True,
    FailureKind.UNKNOWN: True,
}

# Most specific first: HTTPUnauthorizedError is also an HTTPClientError, etc.
_BY_TYPE: tuple[tuple[type[BaseException], FailureKind], ...] = (
    (av.error.HTTPUnauthorizedError, FailureKind.AUTH),
    (av.error.HTTPForbiddenError, FailureKind.AUTH),
    (av.error.HTTPNotFoundError, FailureKind.NOT_FOUND),
    (av.error.ConnectionRefusedError, FailureKind.REFUSED),
    (av.error.TimeoutError, FailureKind.TIMEOUT),
    (av.error.ExitError, FailureKind.TIMEOUT),  # our interrupt callback / PyAV's read timeout fired
    (av.error.DecoderNotFoundError, FailureKind.UNSUPPORTED_CODEC),
    (av.error.PatchWelcomeError, FailureKind.UNSUPPORTED_CODEC),
    (av.error.InvalidDataError, FailureKind.CORRUPT),
    (av.error.EOFError, FailureKind.EOF),
    (FileNotFoundError, FailureKind.NOT_FOUND),
    (IsADirectoryError, FailureKind.NOT_FOUND),
    (PermissionError, FailureKind.AUTH),
    (ConnectionRefusedError, FailureKind.REFUSED),
    (TimeoutError, FailureKind.TIMEOUT),
    (EOFError, FailureKind.EOF),
)

_BY_ERRNO = {
    errno_codes.ECONNREFUSED: FailureKind.REFUSED,
    errno_codes.ETIMEDOUT: FailureKind.TIMEOUT,
    errno_codes.EHOSTUNREACH: FailureKind.TIMEOUT,
    errno_codes.ENETUNREACH: FailureKind.TIMEOUT,
    errno_codes.ECONNRESET: FailureKind.EOF,
    errno_codes.EPIPE: FailureKind.EOF,
    errno_codes.ENOENT: FailureKind.NOT_FOUND,
    errno_codes.EACCES: FailureKind.AUTH,
}

# Lower-case fragments of FFmpeg/OS messages, for errors that arrive as text.
_BY_TEXT: tuple[tuple[str, FailureKind], ...] = (
    ("decoder not found", FailureKind.UNSUPPORTED_CODEC),
    ("unsupported codec", FailureKind.UNSUPPORTED_CODEC),
    ("not currently supported", FailureKind.UNSUPPORTED_CODEC),
    ("401", FailureKind.AUTH),
    ("unauthorized", FailureKind.AUTH),
    ("403", FailureKind.AUTH),
    ("forbidden", FailureKind.AUTH),
    ("404", FailureKind.NOT_FOUND),
    ("not found", FailureKind.NOT_FOUND),
    ("no such file", FailureKind.NOT_FOUND),
    ("connection refused", FailureKind.REFUSED),
    ("timed out", FailureKind.TIMEOUT),
    ("timeout", FailureKind.TIMEOUT),
    ("stalled", FailureKind.TIMEOUT),
    ("immediate exit requested", FailureKind.TIMEOUT),
    ("name or service not known", FailureKind.DNS),
    ("temporary failure in name resolution", FailureKind.DNS),
    ("failed to resolve", FailureKind.DNS),
    ("no address associated", FailureKind.DNS),
    ("invalid data", FailureKind.CORRUPT),
    ("not a video", FailureKind.CORRUPT),
    ("no video stream", FailureKind.CORRUPT),
    ("truncated", FailureKind.CORRUPT),
    ("end of file", FailureKind.EOF),
    ("connection reset", FailureKind.EOF),
)


def classify(exc_or_message: BaseException | str) -> tuple[FailureKind, bool, str]:
    """``(kind, retryable, reason)`` for an exception or an error message.

    The reason is one line, without the URL or credentials, e.g.
    ``"Server returned 401 Unauthorized (authorization failed)"``.
    """
    if isinstance(exc_or_message, BaseException):
        kind = _kind_of_exception(exc_or_message)
        reason = describe(exc_or_message)
        if kind is FailureKind.UNKNOWN:
            kind = _kind_of_text(reason)
    else:
        reason = _one_line(redact_url(exc_or_message))
        kind = _kind_of_text(reason)
    return kind, RETRYABLE[kind], reason


def describe(exc: BaseException) -> str:
    """One line naming what went wrong, without the filename PyAV appends to ``str(exc)``."""
    strerror = getattr(exc, "strerror", None)
    text = strerror if isinstance(strerror, str) and strerror else str(exc) or type(exc).__name__
    return _one_line(redact_url(text))


def _kind_of_exception(exc: BaseException) -> FailureKind:
    kind = getattr(exc, "kind", None)  # an already classified SourceConnectionError
    if isinstance(kind, str) and kind in FailureKind._value2member_map_:
        return FailureKind(kind)
    for exc_type, mapped in _BY_TYPE:
        if isinstance(exc, exc_type):
            return mapped
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in _BY_ERRNO:
        return _BY_ERRNO[code]
    return FailureKind.UNKNOWN


def _kind_of_text(text: str) -> FailureKind:
    lowered = text.lower()
    for fragment, kind in _BY_TEXT:
        if fragment in lowered:
            return kind
    return FailureKind.UNKNOWN


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
