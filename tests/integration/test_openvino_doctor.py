"""The CPU default end to end: `detstream doctor` through the real CLI, and the demo clip through `detstream run`
with the default config (auto → OpenVINO on this CPU), read by a plain pyzmq subscriber."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from app.publish.messages import validate_detection
from tests.conftest import count_frames, detstream

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def test_doctor_says_no_gpu_what_auto_picks_and_what_a_gpu_user_installs() -> None:
    t0 = time.monotonic()
    result = detstream("doctor", timeout_s=30)
    elapsed = time.monotonic() - t0
    assert result.returncode == 0, result.stderr[-2000:]
    assert elapsed < 5, f"doctor took {elapsed:.1f} s"
    text = result.stdout
    assert "GPU          none:" in text
    expected = "openvino:CPU:" if HAS_OPENVINO else "onnxruntime:CPU:"
    assert f"engine.backend: auto picks {expected}" in text
    assert "pip install 'detstream[tensorrt]'" in text and "an NVIDIA GPU with its driver" in text

    as_json = json.loads(detstream("doctor", "--json", timeout_s=30).stdout)
    assert as_json["gpu"]["present"] is False
    assert as_json["picks"]["backend"] == ("openvino" if HAS_OPENVINO else "onnxruntime")
    assert any("detstream[tensorrt]" in m["install"] for m in as_json["missing"] if m["engine"] == "tensorrt:GPU")


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_the_default_config_runs_the_clip_on_openvino(bikes, default_model, collector, port) -> None:
    result = detstream("run", "--source", f"clip={bikes}", "--publish", f"tcp://127.0.0.1:{port}", "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    collector.stop()
    dets = collector.detections("clip")
    assert [d["seq"] for d in dets] == list(range(count_frames(bikes)))
    assert {d["engine"].rsplit(":", 1)[0] for d in dets} == {"openvino:CPU"}
    assert dets[0]["engine"].rsplit(":", 1)[1] in ("bf16", "fp32")
    assert not [p for d in dets[:: max(1, len(dets) // 20)] for p in validate_detection(d)]
    assert sum(len(d["detections"]) for d in dets) > len(dets), "the default model should find objects"
    assert "picked openvino:CPU:" in result.stderr and "WARNING" not in result.stderr


def test_without_openvino_the_real_probe_and_doctor_pick_onnxruntime(tmp_path) -> None:
    """A process where ``import openvino`` fails, as after ``pip uninstall openvino``."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; sys.modules['openvino'] = None\n"
            "from app.cli import main; sys.exit(main(['doctor', '--json']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["openvino"]["version"] is None and report["picks"]["engine"] == "onnxruntime:CPU:fp32"
    assert {"engine": "openvino:CPU", "reason": "openvino is not installed", "install": "pip install openvino"} in \
        report["missing"]


def test_without_openvino_the_clip_runs_on_onnxruntime_and_says_so_once(bikes, default_model, collector, port) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    args = ["run", "--source", f"clip={bikes}", "--publish", f"tcp://127.0.0.1:{port}", "--no-progress"]
    code = f"import sys; sys.modules['openvino'] = None\nfrom app.cli import main; sys.exit(main({args!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    collector.stop()
    dets = collector.detections("clip")
    assert [d["seq"] for d in dets] == list(range(count_frames(bikes)))
    assert {d["engine"] for d in dets} == {"onnxruntime:CPUExecutionProvider:fp32"}
    said = [line for line in proc.stderr.splitlines() if "openvino" in line]
    assert len(said) == 1 and "openvino is not installed" in said[0] and "INFO" in said[0], said
