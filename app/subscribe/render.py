"""``detstream subscribe``: print (and optionally record) messages from a publisher.

Formats: ``table`` (one readable row per message, for people), ``json`` (one
indented map per message, blank line between), ``jsonl`` (one compact map per
line, for tools). ``--out FILE.jsonl`` records every received message as
JSON lines, flushed per line, while printing in the chosen format.
``--events`` prints zone and line events (``event/<id>/``, docs/analytics.md)
instead of detections and statuses; ``--count`` then counts events.

Exit codes: 0 when stopped by ``--count``, ``--timeout`` or Ctrl-C; 1 when
``--timeout`` ran out before ``--count`` detection messages arrived; 2 when
the endpoint or output file cannot be used.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.markup import escape

from app.subscribe.client import Subscriber
from app.subscribe.messages import DetectionMessage, EventMessage, GapEvent, Message

Format = Literal["table", "json", "jsonl"]
_HEADER = f"{'stream':<16} {'seq':>8} {'total ms':>9} {'drops':>6}  detections"
_EVENT_HEADER = f"{'stream':<16} {'seq':>8} {'event':<14} {'zone/line':<16} {'track':>6} {'label':<12} counts"


def format_counts(message: DetectionMessage) -> str:
    """``person×5 car×1``; ``-`` when the frame has no detections."""
    counts = message.label_counts()
    return " ".join(f"{label}×{n}" for label, n in counts.items()) or "-"


def event_counts(message: EventMessage) -> str:
    """``in 6 out 3 now 2``: the region's totals after the event."""
    counts = message.counts
    now = f" now {counts['occupancy']}" if "occupancy" in counts else ""
    return f"in {counts['in']} out {counts['out']}{now}"


def table_row(message: Message) -> str:
    """One fixed-width row (rich markup escaped) for the table format."""
    if isinstance(message, EventMessage):
        what = message.kind + (f" {message.direction}" if message.direction else "") + (
            f" ({message.reason})" if message.reason else "")
        return (f"{escape(message.stream):<16} {message.seq:>8} {escape(what):<14} {escape(message.region):<16} "
                f"{message.track_id:>6} {escape(message.label):<12} {event_counts(message)}")
    if isinstance(message, DetectionMessage):
        return (f"{escape(message.stream):<16} {message.seq:>8} {message.latency_ms.total:>9.1f} "
                f"{message.dropped_before:>6}  {escape(format_counts(message))}")
    retry = f", retry in {message.retry_in_s:.1f} s" if message.retry_in_s is not None else ""
    reason = f" ({escape(message.reason)})" if message.reason else ""
    return (f"[bold]{escape(message.stream):<16} {'status':>8}[/bold] {message.state}{reason}"
            f" attempt {message.attempt}{retry}, frames {message.frames}, dropped {message.dropped}")


def gap_row(gap: GapEvent) -> str:
    verdict = "as reported" if gap.explained else f"publisher reported {gap.dropped_before}"
    return f"[yellow]{escape(gap.stream):<16} gap: {gap.missing} missing before seq {gap.seq} ({verdict})[/yellow]"


def _jsonl(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


class _Printer:
    """Writes messages in one format to ``out`` (and every message as JSON lines to ``record``)."""

    def __init__(self, fmt: Format, out: TextIO, record: TextIO | None, events: bool = False) -> None:
        self._fmt = fmt
        self._out = out
        self._record = record
        self._console = Console(file=out, highlight=False, soft_wrap=True)
        if fmt == "table":
            self._console.print(f"[bold]{_EVENT_HEADER if events else _HEADER}[/bold]")

    def message(self, message: Message, gap: GapEvent | None) -> None:
        payload = message.to_payload()
        if self._record is not None:
            self._record.write(_jsonl(payload) + "\n")
            self._record.flush()
        if self._fmt == "table":
            if gap is not None:
                self._console.print(gap_row(gap))
            self._console.print(table_row(message))
        elif self._fmt == "json":
            self._out.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n\n")
        else:
            self._out.write(_jsonl(payload) + "\n")
        self._out.flush()

    def note(self, text: str) -> None:
        """A line for people: on the console for table, on stderr otherwise (stdout stays parseable)."""
        if self._fmt == "table":
            self._console.print(f"[dim]{escape(text)}[/dim]")
        else:
            print(text, file=sys.stderr)


def run_subscribe(
    endpoint: str,
    streams: Sequence[str],
    fmt: Format,
    count: int | None,
    timeout_s: float | None,
    out_path: str | Path | None,
    *,
    output: TextIO | None = None,
    events: bool = False,
) -> int:
    """Print messages from ``endpoint`` until ``count`` detection messages, ``timeout_s`` or Ctrl-C; exit code.

    ``output`` defaults to stdout (tests pass a StringIO). ``events``: print zone and line events instead (and
    count those).
    """
    out = output if output is not None else sys.stdout
    try:
        record = open(out_path, "a", encoding="utf-8", buffering=1) if out_path else None  # noqa: SIM115
    except OSError as error:
        print(f"detstream subscribe: cannot write {out_path}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        topics = ("event/",) if events else ("det/", "status/")
        subscriber = Subscriber(endpoint, streams=tuple(streams or ()), topics=topics)
    except ValueError as error:
        print(f"detstream subscribe: {error}", file=sys.stderr)
        if record is not None:
            record.close()
        return 2
    printer = _Printer(fmt, out, record, events)
    counted = EventMessage if events else DetectionMessage
    detections = 0
    gaps_seen = 0
    previous = _stop_on_sigterm()
    try:
        for message in subscriber.iter_messages(timeout_s=timeout_s):
            new_gap = subscriber.stats.gaps != gaps_seen
            gaps_seen = subscriber.stats.gaps
            printer.message(message, subscriber.last_gap if new_gap else None)
            detections += isinstance(message, counted)
            if count is not None and detections >= count:
                break
    except KeyboardInterrupt:
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        subscriber.close()
        if record is not None:
            record.close()
    if count is not None and detections < count:
        what = "events" if events else "detection messages"
        printer.note(f"timed out after {timeout_s} s with {detections} of {count} {what}")
        return 1
    return 0


__all__ = ["Format", "event_counts", "format_counts", "gap_row", "run_subscribe", "table_row"]


def _stop_on_sigterm():
    """SIGTERM ends the subscriber like Ctrl-C (exit 0, recording closed), as `docker stop` expects of a recorder.

    Only on the main thread, where Python delivers signals; returns the handler to restore, or None.
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
