"""StopRequest: signals are stop requests from the first import on; other commands get their handlers back."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from app.cli import main
from app.stop import StopRequest
from tests.conftest import ROOT

# The signal tests run in a fresh interpreter: a process that has loaded OpenVINO and ONNX Runtime threads (as the
# test process has by now) is no place to send itself signals, and StopRequest is what `python -m app` installs
# first, before anything else is loaded.
TARGET = """
import os, signal
from app.stop import StopRequest

class Target:
    def __init__(self):
        self.stops = 0

    @property
    def stopping(self):
        return False  # a target that is stopping makes the next signal exit at once (130)

    def stop(self):
        self.stops += 1
"""


def run_script(body: str) -> str:
    """Run TARGET + ``body`` in a new interpreter; its stdout (it prints what it checked)."""
    result = subprocess.run([sys.executable, "-c", TARGET + textwrap.dedent(body)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_signal_before_anything_exists_is_remembered_and_stops_what_is_attached_later():
    out = run_script("""
        stop = StopRequest().install()
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler at the next bytecode
        requested = stop.requested
        target = Target()
        stop.attach(target)
        print(requested, target.stops)
    """)
    assert out == "True 1"


def test_a_signal_after_attaching_stops_the_target_at_once():
    out = run_script("""
        stop = StopRequest().install()
        target = Target()
        stop.attach(target)
        before = (target.stops, stop.requested)
        os.kill(os.getpid(), signal.SIGINT)
        print(before, stop.requested, target.stops)
    """)
    assert out == "(0, False) True 1"


def test_uninstall_gives_the_handlers_back_and_delivers_a_pending_signal_again():
    out = run_script("""
        stop = StopRequest().install()
        installed = signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGINT)
        try:
            stop.uninstall()
            raised = False
        except KeyboardInterrupt:
            raised = True
        print(installed, raised, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    assert out == "True True True"


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_command_other_than_run_gets_the_previous_handlers_back(restore_handlers, tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    file = tmp_path / "c.yaml"
    file.write_text("sources:\n  - url: a.mp4\n")
    assert main(["config", "check", str(file)], stop=StopRequest().install()) == 0
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before


def test_the_detstream_command_installs_its_handlers_before_importing_anything_heavy():
    """The console script (what `make demo`, containers and users run) and `python -m app` share app.entry:main,
    whose import loads nothing but app.stop: the stop request is in place before the CLI's imports start."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["detstream"] == "app.entry:main"
    out = subprocess.run([sys.executable, "-c", "import app.entry, sys; "
                          "print(sorted(m for m in sys.modules if m.startswith('app')))"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "['app', 'app.entry', 'app.stop']", out.stderr[-1000:]
