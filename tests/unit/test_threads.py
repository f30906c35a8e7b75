"""Stage threads are visible by name to the operating system's tools (``top -H``, ``ps -L``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from app.threads import StageThread, os_thread_name

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task/*/comm")


@pytest.mark.parametrize(("name", "expected"), [
    ("detstream.postprocess", b"postprocess"),
    ("detstream.engine.ctx1", b"engine.ctx1"),
    ("detstream.decode.front-door-camera", b"decode.front-do"),
    ("detstream.decode.caméra-entrée", "decode.caméra-".encode()),
    ("detstream.decode.abcdefgé", b"decode.abcdefg"),  # never half a UTF-8 character
    ("bench.sub", b"bench.sub"),
    ("detstream.", b"detstream."),
])
def test_os_names_drop_the_common_prefix_and_fit_the_kernels_15_bytes(name: str, expected: bytes) -> None:
    assert os_thread_name(name) == expected
    assert len(os_thread_name(name)) <= 15


def _comm_of(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@linux_only
def test_a_stage_thread_carries_its_name_to_the_kernel_and_the_caller_keeps_its_own() -> None:
    seen: list[str] = []
    thread = StageThread(lambda: seen.append(_comm_of(threading.get_native_id())), "detstream.decode.cam1")
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and thread.daemon
    assert seen == ["decode.cam1"]
    assert thread.name == "detstream.decode.cam1"  # Python's own name is unchanged
    assert _comm_of(threading.get_native_id()) != "decode.cam1"


@linux_only
def test_threads_started_from_a_stage_thread_inherit_its_name() -> None:
    """What makes FFmpeg's codec threads show up as their decoder's."""
    seen: list[str] = []

    def spawn() -> None:
        child = threading.Thread(target=lambda: seen.append(_comm_of(threading.get_native_id())))
        child.start()
        child.join(5)

    thread = StageThread(spawn, "detstream.engine.ctx0")
    thread.start()
    thread.join(5)
    assert seen == ["engine.ctx0"]


def test_join_within_says_whether_the_thread_ended_in_time() -> None:
    release = threading.Event()
    thread = StageThread(release.wait, "detstream.test")
    assert thread.join_within(0.01)  # never started: nothing to wait for
    thread.start()
    assert not thread.join_within(0.05)
    release.set()
    assert thread.join_within(5)
