"""The whole pipeline on live RTSP: the CLI in a subprocess, the real RTSP server, a plain pyzmq SUB.

Eight cameras and one dead URL at once; the server is killed and restarted
mid-run. Checks the contract: detections per camera, `reconnecting` for the
dead one, detections resuming after the restart, seq gaps equal to
`dropped_before`, and no password anywhere in what is published or logged.
"""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import start_detstream, stop_process, wait_until
from tests.integration.rtsp import dead_port

CAMERAS = [f"cam{i}" for i in range(8)]
SECRET = "Pip3lineS3cret"



def counts(collector) -> dict[str, int]:
    dets = collector.detections()
    return {cam: sum(1 for d in dets if d["stream"] == cam) for cam in CAMERAS}


@pytest.mark.slow
def test_eight_rtsp_cameras_and_a_dead_one_publish_through_a_server_restart(rtsp_server, default_model, collector,
                                                                            port):
    server = rtsp_server({f"/{cam}": "pattern:320x240@5" for cam in CAMERAS}, user="viewer", password=SECRET)
    args = ["run", "--publish", f"tcp://127.0.0.1:{port}", "--max-batch", "8", "--no-progress"]
    for cam in CAMERAS:
        args += ["--source", f"{cam}={server.url('/' + cam, 'viewer', SECRET)}"]
    args += ["--source", f"dead=rtsp://viewer:{SECRET}@127.0.0.1:{dead_port()}/gone"]
    proc = start_detstream(*args)
    try:
        started = wait_until(lambda: min(counts(collector).values()) >= 3, timeout_s=90)
        assert started, f"not every camera published: {counts(collector)}"
        assert wait_until(lambda: any(s["state"] == "reconnecting" for s in collector.statuses("dead")), 10)

        server.kill()
        assert wait_until(lambda: all(any(s["state"] == "reconnecting" for s in collector.statuses(cam))
                                      for cam in CAMERAS), timeout_s=20)
        before = counts(collector)
        server.restart()
        resumed = wait_until(lambda: all(counts(collector)[c] >= before[c] + 3 for c in CAMERAS), timeout_s=60)
        assert resumed, f"detections did not resume on every camera: {before} -> {counts(collector)}"
    finally:
        code, _, stderr = stop_process(proc, timeout_s=20)
    messages = collector.stop()
    assert code == 0, stderr[-2000:]

    for cam in CAMERAS:
        dets = collector.detections(cam)
        seqs = [d["seq"] for d in dets]
        assert seqs == sorted(set(seqs)), f"{cam}: seqs not increasing"
        for previous, current in itertools.pairwise(dets):
            assert current["seq"] - previous["seq"] - 1 == current["dropped_before"], cam
        states = [s["state"] for s in collector.statuses(cam)]
        assert "reconnecting" in states and states.index("reconnecting") < len(states) - 1
    dead = collector.statuses("dead")
    assert not collector.detections("dead")
    retries = [s for s in dead if s["state"] == "reconnecting"]
    assert retries and {s.get("attempt", 0) for s in retries} != {0}
    assert "refused" in retries[-1]["reason"]
    published_text = repr(messages)
    assert SECRET not in published_text and SECRET not in stderr
    assert "viewer:***@" in published_text
