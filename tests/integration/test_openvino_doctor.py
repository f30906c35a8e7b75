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
