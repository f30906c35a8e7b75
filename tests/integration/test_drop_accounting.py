"""A live run that drops frames: the final status, the run summary and /metrics give the same counts, exactly.

Six copies of vtest played ``realtime`` (10 fps each, as cameras) with the real model on the CPU, and a
``max_staleness_ms`` of 30: more frames than a small machine runs, and frames that wait for a batch go stale
on a large one, so the live policy drops some either way. The run is the real pipeline in process (real
sources, engine, ZeroMQ publisher and health server), so /metrics can be read after the last status.
"""

from __future__ import annotations

import logging
import re
import time

from app.config import parse_config
from app.health import HealthServer
from app.pipeline import Pipeline
from app.runner import _exit_code
from tests.conftest import ROOT, Collector, free_port
from tests.integration.test_ops import http_get

CAMERAS = 6


def test_final_status_run_summary_and_metrics_agree_on_dropped_frames(vtest, default_model, caplog):
    port = free_port()
    config = parse_config({
        "sources": [{"id": f"cam{i}", "url": str(vtest), "realtime": True, "loop": True,
                     "max_staleness_ms": 30} for i in range(CAMERAS)],
        "engine": {"max_batch": 4},
        "publish": {"endpoint": f"tcp://127.0.0.1:{port}", "startup_wait_s": 1.0},
    })
    collector = Collector(f"tcp://127.0.0.1:{port}").start()
    pipeline = Pipeline(config, models_dir=ROOT / "models")
    health = HealthServer(pipeline, "127.0.0.1", 0)
    health.start()
    try:
        pipeline.start()
        time.sleep(8)
        pipeline.stop()
        assert pipeline.wait(15)
        pipeline.close()
        status, metrics = http_get(health.port, "/metrics")
        assert status == 200
        with caplog.at_level(logging.INFO, logger="detstream"):
            assert _exit_code(pipeline) == 0
    finally:
        pipeline.force_stop()
        health.stop()
    collector.stop()

    summary = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in
               (re.match(r"(cam\d+): published (\d+) frames, dropped (\d+), ended", r.getMessage())
                for r in caplog.records) if m}
    assert sorted(summary) == [f"cam{i}" for i in range(CAMERAS)], caplog.text[-2000:]
    total_dropped = 0
    for i in range(CAMERAS):
        stream = f"cam{i}"
        final = collector.statuses(stream)[-1]
        assert final["state"] == "ended"
        published = len(collector.detections(stream))
        dropped_metric = sum(float(v) for v in re.findall(
            rf'detstream_frames_dropped_total\{{reason="[a-z_]+",stream="{stream}"\}} ([0-9.e+]+)', metrics))
        published_metric = float(re.search(
            rf'detstream_frames_published_total\{{stream="{stream}"\}} ([0-9.e+]+)', metrics).group(1))
        assert final["dropped"] == summary[stream][1] == dropped_metric, (stream, final, summary[stream])
        assert published == summary[stream][0] == published_metric, stream
        # frames is the last published seq + 1: frames dropped after that one are counted but not in it
        assert published + final["dropped"] >= final["frames"], stream
        assert sum(d["dropped_before"] for d in collector.detections(stream)) <= final["dropped"], stream
        total_dropped += final["dropped"]
    assert total_dropped > 0, "the run was meant to drop frames: the check above would prove nothing"
