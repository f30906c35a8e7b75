"""Logging setup: human-readable by default, JSON lines for log shippers; credentials always masked."""

from __future__ import annotations

import json
import logging
import sys
import time

from app.redact import redact_url


class RedactingFilter(logging.Filter):
    """Masks ``user:password@`` in every record, whatever logger or library produced it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_url(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, thread, message, source_id when known."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"ts": round(record.created, 3), "time": stamp,
                 "level": record.levelname, "logger": record.name, "thread": record.threadName,
                 "message": record.getMessage()}
        if getattr(record, "source_id", None):
            entry["source_id"] = record.source_id
        if record.exc_text:
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = redact_url(self.formatException(record.exc_info))
        return json.dumps(entry)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger once for a CLI process (never at import time)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("libav").setLevel(logging.ERROR)
