"""Credential masking for everything detstream prints, logs or publishes.

Camera URLs routinely carry ``user:password@``; operators paste logs into
tickets, so the password must never leave the process.

Two guards, both linear in the length of the text:

- URLs are masked by parsing: after each ``scheme://``, the userinfo ends at
  the *last* ``@`` before the next blank, quote or URL (FFmpeg also takes the
  last ``@``), so a password written raw with ``/ @ : %`` is masked whole.
- Values interpolated from ``${VAR}`` into a URL's userinfo are registered
  with :func:`register_secret` (by :func:`app.config.parse_config`) and masked
  wherever they appear, as written and percent-encoded.
"""

from __future__ import annotations

import json
import re
import threading
from urllib.parse import quote

MASK = "***"
MIN_SECRET_CHARS = 4  # shorter registered values would mask ordinary words; URLs still mask them by parsing

_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_TOKEN_END = re.compile(r"[\s'\"]")
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Mask ``value`` in every later :func:`redact_url` call of this process.

    Also its percent-encoded, ``repr`` and JSON-escaped forms: error lines quote values with ``repr``.
    """
    if len(value) < MIN_SECRET_CHARS:
        return
    forms = {value, quote(value, safe=""), repr(value)[1:-1], json.dumps(value)[1:-1],
             json.dumps(value, ensure_ascii=False)[1:-1]}
    with _secrets_lock:
        _secrets.update(form for form in forms if len(form) >= MIN_SECRET_CHARS)


def forget_secrets() -> None:
    """Drop every registered secret (tests; each test's config is its own)."""
    with _secrets_lock:
        _secrets.clear()


def redact_url(text: str) -> str:
    """Replace the password of every ``scheme://user:pass@`` in ``text`` with ``***``, and every registered secret.

    >>> redact_url("rtsp://admin:hunter2@10.0.0.5/stream1")
    'rtsp://admin:***@10.0.0.5/stream1'
    >>> redact_url("rtsp://admin:p@ss:w/rd%@10.0.0.5/stream1")
    'rtsp://admin:***@10.0.0.5/stream1'
    """
    if "://" in text:
        text = _mask_userinfo(text)
    if _secrets:
        with _secrets_lock:
            secrets = sorted(_secrets, key=len, reverse=True)  # longest first: a secret may contain another
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, MASK)
    return text


def _mask_userinfo(text: str) -> str:
    """One pass over ``text``: every URL's userinfo is the span from ``//`` to the last ``@`` of its token."""
    out: list[str] = []
    done = 0  # text[:done] is already in out
    marks = _scheme_marks(text)
    for i, (start, after) in enumerate(marks):
        if start < done:
            continue
        end = marks[i + 1][0] if i + 1 < len(marks) else len(text)
        blank = _TOKEN_END.search(text, after, end)
        if blank is not None:
            end = blank.start()
        at = text.rfind("@", after, end)
        if at < 0:
            continue
        colon = text.find(":", after, at)
        if colon < 0 or any(c in "/?#" for c in text[after:colon]):
            continue  # no password, or the ':' belongs to a host:port before a path that holds an '@'
        out.append(text[done:colon + 1])
        out.append(MASK)
        done = at
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _scheme_marks(text: str) -> list[tuple[int, int]]:
    """``(scheme start, index after '//')`` of every URL; each character is looked at a bounded number of times."""
    marks = []
    previous_end = 0
    pos = text.find("://")
    while pos >= 0:
        start = pos
        while start > previous_end and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < pos and not text[start].isalpha():
            start += 1  # a scheme starts with a letter
        if start < pos:
            marks.append((start, pos + 3))
        previous_end = pos + 3
        pos = text.find("://", previous_end)
    return marks
