"""The on-demand interrupt of PyAV calls: only the requested thread sees its clock jump."""

from __future__ import annotations

import threading
import time

import av.container.core

from app.sources import interrupt


def test_install_hooks_the_clock_pyav_uses_for_its_interrupt_callback():
    assert interrupt.install()
    assert interrupt.install(), "idempotent"
    assert av.container.core.time.monotonic() - time.monotonic() < 1.0
    assert av.container.core.time.sleep is time.sleep


def test_only_the_requested_thread_sees_every_reading_jump_ahead():
    interrupt.install()
    clock = av.container.core.time
    readings: dict[str, list[float]] = {}
    go = threading.Event()

    def read(name: str) -> None:
        go.wait(5)
        readings[name] = [clock.monotonic(), clock.monotonic()]

    requested = threading.Thread(target=read, args=("requested",))
    other = threading.Thread(target=read, args=("other",))
    requested.start()
    other.start()
    interrupt.request(requested.ident)
    go.set()
    requested.join(5)
    other.join(5)
    interrupt.clear(requested.ident)
    first, second = readings["requested"]
    assert first - time.monotonic() > 1e8 and second - first > 1e8, "a deadline set after the request still passes"
    assert abs(readings["other"][0] - time.monotonic()) < 5.0
