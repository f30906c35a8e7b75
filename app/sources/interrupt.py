"""Interrupting a PyAV call that is blocked in the network, from another thread.

``av.open(..., timeout=(open_s, read_s))`` installs an FFmpeg interrupt
callback (``av/container/core.py::interrupt_cb``) that aborts a blocked
``avformat_open_input``/``av_read_frame`` once ``time.monotonic()`` passes
the deadline. FFmpeg polls it about every 100 ms while waiting on a socket.
PyAV offers no way to fire it on demand, and closing the container from
another thread while FFmpeg reads from it would be a use-after-free.

So :func:`request` makes the callback see a clock far in the future, but only
on the requested thread, and each reading jumps further ahead (so even a
deadline that PyAV set after the request, with the same shifted clock, has
passed at the next check): PyAV looks ``time.monotonic`` up through the
``time`` global of ``av.container.core`` each time, so that global is replaced
(once, process-wide) by a proxy of the ``time`` module that consults a set of
thread ids. Every other thread, and every other use of the module, sees the
real clock. If a PyAV version has no such global, :func:`install` returns
False and blocked reads end only at the read timeout (a WARNING says so once).
"""

from __future__ import annotations

import logging
import threading
import time
import types

logger = logging.getLogger(__name__)

_JUMP_S = 1e9
_requested: dict[int, int] = {}  # thread ident -> readings of the shifted clock so far
_install_lock = threading.Lock()
_installed: bool | None = None


class _InterruptingClock(types.SimpleNamespace):
    """Stands in for the ``time`` module inside ``av.container.core``."""

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    @staticmethod
    def monotonic() -> float:
        now = time.monotonic()
        ident = threading.get_ident()
        jumps = _requested.get(ident)
        if jumps is None:
            return now
        _requested[ident] = jumps + 1
        return now + _JUMP_S * (jumps + 1)


def install() -> bool:
    """Hook PyAV's interrupt callback (idempotent); False when this PyAV cannot be hooked."""
    global _installed
    with _install_lock:
        if _installed is None:
            _installed = _hook()
            if not _installed:
                logger.warning("this PyAV cannot be interrupted on demand: stop() waits for the read timeout")
        return _installed


def _hook() -> bool:
    try:
        import av.container.core as core
    except ImportError:
        return False
    current = getattr(core, "time", None)
    if isinstance(current, _InterruptingClock):
        return True
    if current is not time:
        return False
    core.time = _InterruptingClock()
    return True


def request(thread_ident: int | None) -> None:
    """Make the PyAV call blocked on that thread (and any later one) return at once.

    Only for a thread that is still running: idents are reused, so the owner
    must :func:`clear` it when the thread ends and never request after that.
    """
    if thread_ident is not None:
        _requested.setdefault(thread_ident, 0)


def clear(thread_ident: int | None) -> None:
    """Forget a request (thread idents are reused once a thread has ended)."""
    if thread_ident is not None:
        _requested.pop(thread_ident, None)
