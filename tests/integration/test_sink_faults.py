"""An optional sink that fails never holds the run: ``--annotate`` onto a real 2 MB tmpfs that fills up.

The file run must publish every frame and exit 0; the live run must keep publishing and exit 0 on SIGTERM.
Either way the failure is one WARNING naming the sink and the error, ``/healthz`` shows it, and nothing
prints a traceback. Mounting a tmpfs needs root (CAP_SYS_ADMIN); without it these tests are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import count_frames, detstream, free_port, start_detstream, stop_process, wait_until
from tests.integration.test_ops import http_get


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A 2 MB tmpfs: a few hundred frames of annotated video fill it."""
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot build a small filesystem")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=10)
    if done.returncode != 0:
        pytest.skip(f"mounting a 2 MB tmpfs is not permitted here ({done.stderr.strip()[:200]})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=10)


def sink_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "WARNING" in line and "sink annotate failed:" in line]


def test_a_file_run_annotating_onto_a_full_disk_publishes_every_frame_and_exits_0(vtest, default_model, full_disk,
                                                                                  collector, port):
    started = time.monotonic()
    result = detstream("run", "--source", f"clip={vtest}", "--publish", f"tcp://127.0.0.1:{port}",
                       "--annotate", str(full_disk / "out"), "--no-progress", timeout_s=180)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert elapsed < 150, f"took {elapsed:.0f} s"
    collector.stop()
    assert [d["seq"] for d in collector.detections("clip")] == list(range(count_frames(vtest)))
    assert collector.statuses("clip")[-1]["state"] == "ended"
    warnings = sink_warnings(result.stderr)
    assert len(warnings) == 1 and "No space left on device (ENOSPC)" in warnings[0], result.stderr[-3000:]
    assert "sink annotate failed during the run: No space left on device" in result.stderr, "the run summary says so"
    assert "Traceback" not in result.stderr + result.stdout


def test_a_live_run_annotating_onto_a_full_disk_keeps_publishing_and_exits_0_on_sigterm(vtest, default_model,
                                                                                       full_disk, collector, port):
    metrics_port = free_port()
    proc = start_detstream("run", "--source", f"cam={vtest}", "--realtime", "--loop", "--publish",
                           f"tcp://127.0.0.1:{port}", "--annotate", str(full_disk / "out"), "--no-progress",
                           "--metrics-port", str(metrics_port))
    try:
        health: dict = {}

        def sink_failed() -> bool:
            nonlocal health
            try:
                status, body = http_get(metrics_port, "/healthz")
            except OSError:
                return False
            health = json.loads(body)
            return status == 200 and bool(health.get("sink_failures"))

        assert wait_until(sink_failed, 120, poll_s=0.5), f"/healthz never showed the failed sink: {health}"
        assert "No space left on device" in health["sink_failures"]["annotate"]
        seen = len(collector.detections("cam"))
        assert wait_until(lambda: len(collector.detections("cam")) >= seen + 20, 20), "publishing went on"
    finally:
        code, out, err = stop_process(proc, timeout_s=15)
    assert code == 0, err[-3000:]
    assert len(sink_warnings(err)) == 1, err[-3000:]
    assert "Traceback" not in out + err
    assert collector.statuses("cam")[-1]["state"] == "ended"
    assert os.path.getsize(full_disk / "out" / "cam.mp4") > 0
