"""The 60-second soak (lab/soak.py) as a test: no RSS, fd or thread growth under RTSP restarts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_a_60_second_soak_with_4_sources_and_rtsp_restarts_does_not_leak(tmp_path, default_model, _gst_rtsp_reason):
    if _gst_rtsp_reason:
        pytest.skip(_gst_rtsp_reason)
    out = tmp_path / "soak"
    result = subprocess.run([sys.executable, "lab/soak.py", "--duration-s", "60", "--sources", "4",
                             "--interval-s", "5", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=180, start_new_session=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"]["failures"] == []
    assert len(summary["samples"]) >= 9 and summary["restarts"], summary["restarts"]
    cameras = {stream: states for stream, states in summary["states"].items() if stream.startswith("cam")}
    assert len(cameras) == 2 and all({"running", "reconnecting"} <= set(s) for s in cameras.values()), cameras
