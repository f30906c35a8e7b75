"""The live progress line: frames done/total, fps, drops and latency per source.

Runs on the main thread, which otherwise only waits for the run to end. On a
TTY it is a rich progress display; otherwise one log line every few seconds,
so CI logs and journald stay readable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.stages.results import StreamSnapshot

logger = logging.getLogger(__name__)


def _summary(stream: StreamSnapshot, fps: float) -> str:
    return (f"{stream.state.value:<12} {fps:6.1f} fps  drops {stream.dropped:<5} "
            f"p50 {stream.p50_total_ms:6.1f} ms")


class ProgressReporter:
    """Polls snapshots of the pipeline's streams (``streams()``, e.g. :meth:`app.pipeline.Pipeline.streams`);
    never touches the pipeline's threads."""

    def __init__(self, streams: Callable[[], Mapping[str, StreamSnapshot]], totals: Callable[[str], int | None],
                 interactive: bool | None = None, log_every_s: float = 5.0) -> None:
        self._snapshot = streams
        self._streams = streams()
        self._totals = totals
        console = Console(stderr=True)
        self._interactive = console.is_terminal if interactive is None else interactive
        self._log_every_s = log_every_s
        self._last_log = time.monotonic()
        self._last = {sid: (time.monotonic(), 0) for sid in self._streams}
        self._fps = dict.fromkeys(self._streams, 0.0)
        self._bar: Progress | None = None
        self._tasks: dict[str, int] = {}
        if self._interactive:
            self._bar = Progress(TextColumn("[bold]{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 transient=False)

    def __enter__(self) -> ProgressReporter:
        if self._bar is not None:
            self._bar.start()
            for sid in self._streams:
                self._tasks[sid] = self._bar.add_task(sid, total=None, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        self.update()
        if self._bar is not None:
            self._bar.stop()
        self.log_summary()

    def update(self) -> None:
        now = time.monotonic()
        self._streams = self._snapshot()
        for sid, stream in self._streams.items():
            if sid not in self._last:  # a source added at runtime
                self._last[sid], self._fps[sid] = (now, stream.published), 0.0
                if self._bar is not None:
                    self._tasks[sid] = self._bar.add_task(sid, total=None, info="")
            t0, n0 = self._last[sid]
            if now - t0 >= 1.0:
                self._fps[sid] = (stream.published - n0) / (now - t0)
                self._last[sid] = (now, stream.published)
            if self._bar is not None:
                self._bar.update(self._tasks[sid], total=self._totals(sid), completed=stream.published,
                                 info=_summary(stream, self._fps[sid]))
        if self._bar is None and now - self._last_log >= self._log_every_s:
            self._last_log = now
            self.log_summary()

    def log_summary(self) -> None:
        for sid, stream in self._streams.items():
            total = self._totals(sid)
            logger.info("%s: %d/%s frames  %s", sid, stream.published, total if total else "?",
                        _summary(stream, self._fps.get(sid, 0.0)))
