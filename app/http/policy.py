"""What the API accepts as a new source, beyond :class:`app.config.SourceConfig`'s own checks.

A URL from the network is less trusted than one from the config file:

* no shell-like text (``;``, ``|``, backquote, ``$``, ``<``, ``>``, a
  backslash, control characters, or a leading ``-``): detstream never runs a
  shell, but such a string is never a camera and is refused before it reaches
  a log or FFmpeg;
* a file (a plain path or ``file://``) or a device only inside one of
  ``http.allowed_paths`` (resolved, so ``..`` and symlinks cannot leave it);
* a network URL only with the schemes the config accepts (rtsp, rtsps, http, https).

Refusals are :class:`SourcePolicyError`, answered 422 naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from app.config import SourceConfig, SourceKind
from app.redact import register_secret

_SHELL_LIKE = re.compile(r"[;|`$<>\\\x00-\x1f\x7f]")


class SourcePolicyError(ValueError):
    """A source the API will not start; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_source(config: SourceConfig, allowed_paths: Sequence[str]) -> None:
    """Refuse (:class:`SourcePolicyError`) a source the API must not start; registers its password as a secret."""
    url = config.url
    if _SHELL_LIKE.search(url) or url.startswith("-"):
        raise SourcePolicyError("url", "shell-like characters are not allowed in a source URL")
    if config.kind in (SourceKind.RTSP, SourceKind.HTTP):
        password = urlsplit(url).password
        if password:
            register_secret(unquote(password))
        return
    path = Path(unquote(urlsplit(url).path) if url.lower().startswith("file://") else url)
    if not path.is_absolute():
        raise SourcePolicyError("url", "a file source must be an absolute path inside http.allowed_paths")
    resolved = path.resolve()
    for allowed in allowed_paths:
        if resolved.is_relative_to(Path(allowed).expanduser().resolve()):
            return
    raise SourcePolicyError("url", "path is outside http.allowed_paths" if allowed_paths else
                            "file and device sources are not accepted through the API (http.allowed_paths is empty)")


__all__ = ["SourcePolicyError", "check_source"]
