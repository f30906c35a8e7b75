"""SIGINT/SIGTERM as a stop request, from the first milliseconds of the process on.

``python -m app`` installs a :class:`StopRequest` before it imports anything
else, so a signal during start-up (config, logging, model load) is never met
by the default action (SIGTERM would end the process with 143, publishing
nothing). Whatever exists when the signal comes is stopped; what is attached
later is stopped at once. The first signal asks for a drain (exit 0); a
signal while the target is already stopping (the second signal, or one after
``duration_s`` ran out) exits at once with 130.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Protocol

logger = logging.getLogger("detstream")

EXIT_FORCED = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stoppable(Protocol):
    """What a signal stops: :class:`app.pipeline.Pipeline`."""

    @property
    def stopping(self) -> bool: ...

    def stop(self) -> None: ...


class StopRequest:
    """Set by the first SIGINT/SIGTERM; stops the attached target (a Pipeline) from the handler."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signum: int | None = None
        self._target: Stoppable | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Handle SIGINT and SIGTERM (main thread only); returns self."""
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers; a signal that came meanwhile is delivered again."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._signum is not None:
            signal.raise_signal(self._signum)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def attach(self, target: Stoppable) -> None:
        """Stop ``target`` on the first signal, or now if it already came."""
        self._target = target
        if self._event.is_set():
            target.stop()

    def request(self, signum: int = signal.SIGTERM) -> None:
        """What the first signal does: remember it and stop the target."""
        self._signum = signum
        self._event.set()
        if self._target is not None:
            self._target.stop()

    def _handle(self, signum: int, _frame: object) -> None:
        if self._event.is_set() or (self._target is not None and self._target.stopping):
            logger.warning("second signal: exiting now")
            os._exit(EXIT_FORCED)
        logger.info("%s: stopping (again to force)", signal.Signals(signum).name)
        self.request(signum)
