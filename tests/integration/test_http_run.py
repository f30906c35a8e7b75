"""`detstream run` with `http.enabled`: the page's URL on stderr, SIGHUP and POST /api/reload apply an edited
config file, /healthz keeps answering on the metrics port, and off loopback the run refuses to start without a token."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tests.conftest import ROOT, free_port, wait_until
from tests.integration.rtsp import make_clip

STARTUP_TIMEOUT_S = 60.0


def _request(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            text = reply.read().decode()
            return reply.status, json.loads(text) if "json" in reply.headers.get("content-type", "") else text
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode() or "{}")
    except OSError as error:
        return 0, str(error)


def _ids(base: str) -> list[str]:
    status, body = _request(base + "/api/sources")
    return [s["id"] for s in body["sources"]] if status == 200 else []


def _config(path: Path, clip: Path, ids: list[str], http_port: int, zmq_port: int = 0, **http) -> None:
    tree = {"sources": [{"id": i, "url": str(clip), "loop": True, "realtime": True} for i in ids],
            "engine": {"max_sources": 3},
            "publish": {"endpoint": f"tcp://127.0.0.1:{zmq_port or free_port()}", "startup_wait_s": 0},
            "http": {"enabled": True, "port": http_port, **http}}
    path.write_text(yaml.safe_dump(tree))


def _start(config: Path, log: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    import os

    return subprocess.Popen([sys.executable, "-m", "app", "run", str(config), "--no-progress", *extra],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True,
                            env={**os.environ, **(env or {})})


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


def test_sighup_and_reload_apply_the_edited_config_and_health_stays_on_the_metrics_port(tmp_path, default_model):
    clip = make_clip(tmp_path / "clip.mp4", frames=30, fps=10, size="160x120")
    config, log = tmp_path / "run.yaml", tmp_path / "stderr.log"
    http_port, metrics_port, zmq_port = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{http_port}"
    _config(config, clip, ["a"], http_port, zmq_port)
    proc = _start(config, log, "--metrics-port", str(metrics_port), "--models-dir", str(default_model.parent))
    try:
        assert wait_until(lambda: _ids(base) == ["a"], STARTUP_TIMEOUT_S), log.read_text()[-2000:]
        assert wait_until(lambda: f"live page on {base}/" in log.read_text(), 5)
        assert wait_until(lambda: _request(base + "/api/sources/a")[1]["state"] == "running", 30)
        _config(config, clip, ["a", "b"], http_port, zmq_port)
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _ids(base) == ["a", "b"], 20), log.read_text()[-2000:]
        assert wait_until(lambda: _request(base + "/api/sources/b") [1].get("published", 0) > 0, 30), \
            (_request(base + "/api/sources/b"), log.read_text()[-2000:])
        _config(config, clip, ["b"], http_port, zmq_port)
        status, diff = _request(base + "/api/reload", "POST", {})
        assert status == 200 and diff == {"added": [], "removed": ["a"], "changed": []}
        assert _ids(base) == ["b"]
        health, _ = _request(f"http://127.0.0.1:{metrics_port}/healthz")
        assert health == 200
        _, metrics = _request(f"http://127.0.0.1:{metrics_port}/metrics")
        assert 'stream="b"' in metrics and 'stream="a"' not in metrics
        page_status, page = _request(base + "/")
        assert page_status == 200 and "detstream" in page
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-3000:]


def test_off_loopback_without_a_token_the_run_refuses_to_start(tmp_path):
    clip = make_clip(tmp_path / "clip.mp4", frames=10, fps=10, size="160x120")
    config, log = tmp_path / "run.yaml", tmp_path / "stderr.log"
    _config(config, clip, ["a"], free_port(), host="0.0.0.0")
    proc = _start(config, log, env={"DETSTREAM_HTTP_TOKEN": ""})
    started = time.monotonic()
    code = _stop(proc) if proc.wait(30) is None else proc.returncode
    assert code == 2 and "DETSTREAM_HTTP_TOKEN" in log.read_text(), log.read_text()[-2000:]
    assert time.monotonic() - started < 30
