"""SIGINT/SIGTERM as a stop request, from the first milliseconds of the process on.

``python -m app`` installs a :class:`StopRequest` before it imports anything
else, so a signal during start-up (config, logging, model load) is never met
by the default action (SIGTERM would end the process with 143, publishing
nothing). Whatever exists when the signal comes is stopped; what is attached
later is stopped at once. The first signal asks for a drain (exit 0); a
signal while the target is already stopping (the second signal, or one after
``duration_s`` ran out) exits at once with 130.

That exit skips every ``finally``, so work in progress registers its
temporary files with :func:`at_forced_exit`; the handler removes them just
before ``os._exit`` (model fetches also sweep what a killed process left, at
the next start: :func:`app.models.store.files.sweep_stale`). Commands other
than ``run`` get the default handlers (Ctrl-C is a KeyboardInterrupt); work
there that must clean up runs inside :func:`interrupts_clean_up`, which gives
a second Ctrl-C the same forced exit instead of letting it cut a ``finally``
short.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

logger = logging.getLogger("detstream")

EXIT_FORCED = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM)


_forced_exit_cleanups: dict[int, Callable[[], None]] = {}
_cleanup_ids = iter(range(1 << 62))


def at_forced_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run ``cleanup`` if a second signal forces the exit (``os._exit`` skips ``finally``); returns its remover.

    ``cleanup`` must be quick and must not raise (it runs inside the signal handler).
    """
    key = next(_cleanup_ids)
    _forced_exit_cleanups[key] = cleanup

    def remove() -> None:
        _forced_exit_cleanups.pop(key, None)

    return remove


def run_forced_exit_cleanups() -> None:
    """Run (once) every registered cleanup; errors are ignored: the process is on its way out."""
    while _forced_exit_cleanups:
        _, cleanup = _forced_exit_cleanups.popitem()
        with contextlib.suppress(Exception):  # a failed cleanup must not stop the others, nor the exit
            cleanup()


@contextmanager
def interrupts_clean_up() -> Iterator[None]:
    """The first SIGINT raises KeyboardInterrupt as usual, so ``finally`` blocks clean up; another one meanwhile
    runs the :func:`at_forced_exit` cleanups and exits with 130 at once.

    For work outside ``run`` (``detstream models fetch``). A no-op off the main thread, or when SIGINT is
    handled otherwise already (``run``'s :class:`StopRequest` forces the exit the same way).
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    interrupted = False

    def handle(_signum: int, _frame: object) -> None:
        nonlocal interrupted
        if interrupted:
            logger.warning("second interrupt: exiting now")
            run_forced_exit_cleanups()
            os._exit(EXIT_FORCED)
        interrupted = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
            run_forced_exit_cleanups()
            os._exit(EXIT_FORCED)
        logger.info("%s: stopping (again to force)", signal.Signals(signum).name)
        self.request(signum)


def exit_now(code: int | str | None) -> None:
    """End the process with ``code`` as ``sys.exit`` would, without interpreter finalization.

    Logs and standard streams are flushed first. Skipping finalization keeps this process's signal handlers in
    place to the end (finalization resets them to the default action) and its stage threads are done by now.
    """
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe must not change the exit code
            stream.flush()
    os._exit(0 if code is None else code)
