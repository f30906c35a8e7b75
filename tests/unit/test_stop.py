"""StopRequest: signals are stop requests from the first import on; other commands get their handlers back."""

from __future__ import annotations

import os
import signal

import pytest

from app.cli import main
from app.stop import StopRequest


class Target:
    def __init__(self) -> None:
        self.stops = 0

    @property
    def stopping(self) -> bool:
        return False  # a target that is stopping makes the next signal exit at once (130): not tested in process

    def stop(self) -> None:
        self.stops += 1


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_signal_before_anything_exists_is_remembered_and_stops_what_is_attached_later(restore_handlers):
    stop = StopRequest().install()
    os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler at the next bytecode
    assert stop.requested
    target = Target()
    stop.attach(target)
    assert target.stops == 1


def test_a_signal_after_attaching_stops_the_target_at_once(restore_handlers):
    stop = StopRequest().install()
    target = Target()
    stop.attach(target)
    assert target.stops == 0 and not stop.requested
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested and target.stops == 1


def test_uninstall_gives_the_handlers_back_and_delivers_a_pending_signal_again(restore_handlers):
    stop = StopRequest().install()
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        stop.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_command_other_than_run_gets_the_previous_handlers_back(restore_handlers, tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    file = tmp_path / "c.yaml"
    file.write_text("sources:\n  - url: a.mp4\n")
    assert main(["config", "check", str(file)], stop=StopRequest().install()) == 0
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
