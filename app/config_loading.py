"""From the parsed YAML tree to what pydantic validates, and from its errors back to one short line.

:class:`StrictModel` is the base of every config section: unknown keys and
non-finite numbers are refused.

``${VAR}`` interpolation runs over the tree before validation, so an unset
variable is reported with its field path, and a value that lands in a URL's
userinfo is percent-encoded and reported as a secret. A validation error
becomes one line that quotes at most :data:`MAX_SHOWN_CHARS` of any value
(masked before it is cut), whatever a generated or pasted config holds.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError

from app.errors import ConfigError
from app.redact import redact_url

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_SHOWN_CHARS = 200      # how much of a bad value an error line quotes
MAX_KEY_CHARS = 64         # how much of a key (an unknown 5,000-character one, say) a field path shows
MAX_PROBLEMS_SHOWN = 5     # an error line names this many problems, then counts the rest

MAX_DEPTH = 32  # no detstream config is deeper; YAML aliases can make a tree infinitely deep


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are mistakes, not extensions."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def interpolate_env(tree: Any, env: dict[str, str], path: str = "", depth: int = 0, *,
                    secrets: set[str] | None = None) -> Any:
    """Replace ``${VAR}`` in every string of a parsed YAML tree; unset names raise with the field path.

    A value that lands in a URL's userinfo (``rtsp://${USER}:${PASSWORD}@host``) is percent-encoded, so a
    password with ``/ @ : %`` still parses (FFmpeg decodes it again); the password is added to ``secrets``.
    """
    if depth > MAX_DEPTH:
        raise ConfigError(f"{shorten(path, 40)}: nested more than {MAX_DEPTH} levels deep "
                          "(a self-referencing YAML alias?)")
    if isinstance(tree, dict):
        return {key: interpolate_env(value, env, f"{path}.{key}" if path else str(key), depth + 1, secrets=secrets)
                for key, value in tree.items()}
    if isinstance(tree, list):
        return [interpolate_env(value, env, f"{path}[{i}]", depth + 1, secrets=secrets)
                for i, value in enumerate(tree)]
    if isinstance(tree, str):
        userinfo = _userinfo_span(tree)

        def _lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise ConfigError(f"{shorten(path, 100)}: environment variable ${{{name}}} is not set")
            value = env[name]
            if userinfo is None or not (userinfo[0] <= match.start() and match.end() <= userinfo[1]):
                return value
            start, end, colon = userinfo
            if match.start() == start and match.end() == end and ":" in value:  # ${CREDENTIALS} = user:password
                user, password = value.split(":", 1)
                if secrets is not None:
                    secrets.add(password)
                return f"{quote(user, safe='')}:{quote(password, safe='')}"
            if secrets is not None and colon is not None and match.start() > colon:
                secrets.add(value)
            return quote(value, safe="")

        return _ENV_REF.sub(_lookup, tree)
    return tree


def _userinfo_span(template: str) -> tuple[int, int, int | None] | None:
    """``(start, end, colon)`` of the userinfo of a URL template (before interpolation), or None.

    ``colon`` is where the password begins after, None when the template has no ``user:`` part.
    """
    scheme_end = template.find("://")
    if scheme_end < 0 or "${" not in template:
        return None
    start = scheme_end + 3
    authority_end = len(template)
    for delimiter in "/?#":
        found = template.find(delimiter, start)
        if 0 <= found < authority_end:
            authority_end = found
    at = template.rfind("@", start, authority_end)
    if at < 0:
        return None
    colon = template.find(":", start, at)
    return start, at, None if colon < 0 else colon


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def printable(text: str) -> str:
    """``text`` with line breaks and other control characters escaped, so an error stays one line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii", "replace")


def format_validation_error(error: ValidationError) -> str:
    """The problems joined by ``; ``, each ``field.path: message (got VALUE)``; the first few, then a count."""
    lines = []
    problems = error.errors()
    for item in problems[:MAX_PROBLEMS_SHOWN]:
        path = ""
        for part in item["loc"]:
            part = part if isinstance(part, int) else shorten(printable(str(part)), MAX_KEY_CHARS)
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = shorten(printable(item["msg"].removeprefix("Value error, ")))
        value = item.get("input")
        hidden = isinstance(value, (dict, list)) or item["type"] == "missing"
        shown = "" if hidden else f" (got {shorten(redact_url(repr(value)))})"  # redacted whole, then cut
        if not path and re.match(r"^[A-Za-z_][\w.\[\]]*: ", message):
            lines.append(f"{message}{shown}")  # a model-level check that already names its field
        else:
            lines.append(f"{path or 'config'}: {message}{shown}")
    if len(problems) > MAX_PROBLEMS_SHOWN:
        lines.append(f"and {len(problems) - MAX_PROBLEMS_SHOWN} more problems")
    return "; ".join(lines)
