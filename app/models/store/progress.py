"""Telling the operator what a fetch is doing: a rich progress line on a terminal, log lines elsewhere.

A first `detstream run` may spend a minute downloading and converting; on a
terminal that must not look like a hang, and in CI or under systemd it must
leave plain, greppable lines instead of cursor codes.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

logger = logging.getLogger(__name__)

Update = Callable[[int, int | None], None]  # (bytes or steps done, total if known)


class Reporter:
    """Announces steps and their progress; one per fetch, used from one thread.

    ``enabled=False`` or a non-terminal ``stream`` gives INFO log lines only,
    on ``log`` (the calling module's logger) so they read as that module's.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, log: logging.Logger | None = None) -> None:
        self._log = log or logger
        self._stream = stream or sys.stderr
        self.interactive = enabled and self._stream.isatty()
        self._console = Console(file=self._stream) if self.interactive else None

    def say(self, message: str) -> None:
        """One line about what is being done."""
        if self._console is not None:
            self._console.print(message, markup=False, highlight=False)
            self._log.debug("%s", message)
        else:
            self._log.info("%s", message)

    @contextmanager
    def step(self, description: str, counts_bytes: bool = False) -> Iterator[Update]:
        """A step with a spinner (plus a byte bar when ``counts_bytes``); yields an ``update(done, total)`` callback."""
        started = time.monotonic()
        if self._console is None:
            self._log.info("%s ...", description)
            yield lambda done, total: None
            self._log.info("%s: done in %.1f s", description, time.monotonic() - started)
            return
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if counts_bytes:
            columns += [BarColumn(), DownloadColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=self._console, transient=False) as bar:
            task = bar.add_task(description, total=None)

            def update(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            yield update
            total = bar.tasks[0].total or 1
            bar.update(task, completed=total, total=total)
        self._log.debug("%s: done in %.1f s", description, time.monotonic() - started)
