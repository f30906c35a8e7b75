"""Stage threads that carry their name to the operating system.

Python (before 3.14) names threads only for itself: ``top -H``, ``ps -L``,
``perf`` and ``/proc/PID/task/*/comm`` all show ``python`` for every thread,
so an operator cannot tell which stage is eating a core. :class:`StageThread`
sets the kernel name of its thread when it starts (Linux ``prctl``; a no-op
elsewhere). A thread started later from it without a name of its own inherits
the name (FFmpeg names its codec threads itself: ``av:h264:df0``).

The kernel keeps 15 bytes: the ``detstream.`` prefix is dropped (every thread
of the process has it), the rest truncated.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Callable
from typing import Any

OS_NAME_BYTES = 15
"""``TASK_COMM_LEN`` (16) less the terminating NUL."""
PREFIX = "detstream."
PR_SET_NAME = 15

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:  # pragma: no cover - a Linux without a loadable libc
        _libc = None


def os_thread_name(name: str) -> bytes:
    """The kernel name for a Python thread name: prefix dropped, at most 15 bytes of whole UTF-8 characters."""
    short = name.removeprefix(PREFIX) or name
    encoded = short.encode()[:OS_NAME_BYTES]
    return encoded.decode(errors="ignore").encode()


def name_current_thread(name: str) -> bool:
    """Give the calling thread ``name`` in the kernel; False where the platform has no way to."""
    if _libc is None:
        return False
    return _libc.prctl(PR_SET_NAME, ctypes.c_char_p(os_thread_name(name)), 0, 0, 0) == 0


class StageThread(threading.Thread):
    """A daemon :class:`threading.Thread` whose name ``top -H`` shows too."""

    def __init__(self, target: Callable[..., object], name: str, **kwargs: Any) -> None:
        super().__init__(target=target, name=name, daemon=True, **kwargs)

    def run(self) -> None:
        name_current_thread(self.name)
        super().run()

    def join_within(self, timeout_s: float | None = None) -> bool:
        """Join for at most ``timeout_s`` (None: until it ends); True when the thread has ended or never
        started, False when it is still running: what a stage's ``join`` reports to its owner."""
        if self.ident is None:
            return True
        self.join(timeout_s)
        return not self.is_alive()
