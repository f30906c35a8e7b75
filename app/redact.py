"""Credential masking for everything detstream prints, logs or publishes.

Camera URLs routinely carry ``user:password@``; operators paste logs into
tickets, so the password must never leave the process.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*)(?::(?P<pw>[^/\s]*))?@")


def redact_url(text: str) -> str:
    """Replace the password of every ``scheme://user:pass@`` in ``text`` with ``***``.

    >>> redact_url("rtsp://admin:hunter2@10.0.0.5/stream1")
    'rtsp://admin:***@10.0.0.5/stream1'
    """
    def _mask(match: re.Match[str]) -> str:
        if match.group("pw") is None:
            return match.group(0)
        return f"{match.group('scheme')}{match.group('user')}:***@"

    return _USERINFO.sub(_mask, text)
