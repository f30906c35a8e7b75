"""Opening a PyAV container for a :class:`SourceConfig`: target, options, timeouts, errors.

Everything here runs on the source's decoder thread. Every error leaves as a
:class:`SourceConnectionError` whose message starts with the redacted URL
(or the file path as given), e.g. ``"vtest.avi: no such file"``.

Each timeout applies to its own phase, through PyAV's interrupt callback
(``av.open(timeout=(open_s, read_s))``): ``open_timeout_s`` from connecting to
the stream's first data, ``min(read_timeout_s, stall_timeout_s)`` for each
later read. FFmpeg's own socket timeout (``timeout`` for RTSP, ``rw_timeout``
for HTTP) covers every phase at once, so it is set just above the longest of
them: a backstop that never cuts a phase short (a camera that answers DESCRIBE
after 20 s is reached with ``open_timeout_s: 30``) and never names a silent
server ``corrupt``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import av

from app.config import SourceConfig, SourceKind
from app.errors import SourceConnectionError
from app.sources.failures import FailureKind, classify

logger = logging.getLogger(__name__)

NETWORK_KINDS = (SourceKind.RTSP, SourceKind.HTTP)


@dataclass(frozen=True)
class OpenPlan:
    """What to pass to ``av.open``: the target, format, options and ``(open, read)`` timeouts."""

    target: str
    format: str | None
    options: dict[str, str]
    open_timeout_s: float
    read_timeout_s: float


SOCKET_BACKSTOP_S = 1.0  # FFmpeg's socket timeout is this much longer than the longest phase timeout


def plan_open(config: SourceConfig) -> OpenPlan:
    """Options per kind; network reads time out at ``min(read_timeout_s, stall_timeout_s)``."""
    kind = config.kind
    if kind is SourceKind.FILE:
        return OpenPlan(file_path(config.url), None, {}, config.open_timeout_s, config.read_timeout_s)
    read_s = min(config.read_timeout_s, config.stall_timeout_s)
    backstop_s = max(config.open_timeout_s, config.read_timeout_s, config.stall_timeout_s) + SOCKET_BACKSTOP_S
    micros = str(int(backstop_s * 1_000_000))
    if kind is SourceKind.RTSP:
        # FFmpeg >= 5 calls the RTSP socket timeout `timeout` (formerly `stimeout`), in microseconds.
        # Probe 1 s instead of FFmpeg's default 5 s: a camera's stream parameters arrive in its first frames.
        options = {"rtsp_transport": config.transport, "timeout": micros, "analyzeduration": "1000000"}
    elif kind is SourceKind.HTTP:
        options = {"rw_timeout": micros}
    else:
        options = {}
    fmt = "v4l2" if kind is SourceKind.DEVICE else None
    return OpenPlan(config.url, fmt, options, config.open_timeout_s, read_s)


def file_path(url: str) -> str:
    """The filesystem path of a file source (``file://`` URLs included)."""
    if url.startswith("file://"):
        return unquote(urlsplit(url).path)
    return url


def check_file(config: SourceConfig) -> None:
    """Fail early, with a plain reason, for files that cannot be a video at all."""
    path = file_path(config.url)
    name = config.safe_url
    if not os.path.exists(path):
        raise SourceConnectionError(f"{name}: no such file", FailureKind.NOT_FOUND.value, False)
    if os.path.isdir(path):
        raise SourceConnectionError(f"{name}: is a directory, not a video file", FailureKind.NOT_FOUND.value, False)
    if not os.access(path, os.R_OK):
        raise SourceConnectionError(f"{name}: permission denied", FailureKind.AUTH.value, False)
    if os.path.getsize(path) == 0:
        raise SourceConnectionError(f"{name}: empty file, not a video", FailureKind.CORRUPT.value, False)


def open_container(config: SourceConfig, hwaccel: object | None = None) -> av.container.InputContainer:
    """``av.open`` with the plan's timeouts; failures become classified, redacted errors."""
    if config.kind is SourceKind.FILE:
        check_file(config)
    plan = plan_open(config)
    started = time.monotonic()
    kwargs = {"hwaccel": hwaccel} if hwaccel is not None else {}
    try:
        return av.open(plan.target, format=plan.format, options=plan.options,
                       timeout=(plan.open_timeout_s, plan.read_timeout_s), **kwargs)
    except (av.FFmpegError, OSError) as exc:
        timed_out = time.monotonic() - started >= plan.open_timeout_s * 0.95
        raise source_error(config, exc, "open", timed_out=timed_out) from None


_HANDSHAKE = {SourceKind.RTSP: "OPTIONS/DESCRIBE/PLAY", SourceKind.HTTP: "the HTTP request"}


def source_error(
    config: SourceConfig, exc: BaseException, during: str, *, timed_out: bool = False
) -> SourceConnectionError:
    """A classified error naming the source (redacted) and the cause in one line."""
    kind, retryable, reason = classify(exc)
    if timed_out:
        kind, retryable = FailureKind.TIMEOUT, True
        asked = _HANDSHAKE.get(config.kind, "open")
        reason = f"no answer to {asked} within {config.open_timeout_s:g} s (open_timeout_s)"
    elif kind is FailureKind.UNKNOWN and during == "open" and _unresolvable(config):
        kind, retryable, reason = FailureKind.DNS, True, f"host name does not resolve ({reason})"
    elif kind is FailureKind.CORRUPT and config.kind is SourceKind.FILE and during == "open":
        reason = f"not a video ({reason})"
    if config.kind is SourceKind.FILE and kind is FailureKind.NOT_FOUND:
        reason = "no such file"
    return SourceConnectionError(f"{config.safe_url}: {kind.value}: {reason}"
                                 if config.kind is not SourceKind.FILE else f"{config.safe_url}: {reason}",
                                 kind.value, retryable)


def _unresolvable(config: SourceConfig) -> bool:
    host = urlsplit(config.url).hostname if config.kind in NETWORK_KINDS else None
    if not host:
        return False
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        return True
    except OSError:
        return False
    return False
