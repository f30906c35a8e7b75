"""Operating a real `detstream run`: /healthz, /readyz and /metrics while it runs, the metrics socket bound to
127.0.0.1 only, JSON logs on stderr, and a camera password that never leaves the process (logs, ZMQ, /metrics)."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, start_detstream, stop_process
from tests.integration.rtsp import make_clip

PASSWORD = "s3cret"
DEAD_CAMERA = f"rtsp://user:{PASSWORD}@127.0.0.1:1/x"
RUN_S = 6.0
STARTUP_TIMEOUT_S = 60.0


@dataclass
class RawSubscriber:
    """A plain SUB socket on its own thread keeping every message as raw bytes (to search for secrets)."""

    endpoint: str
    frames: list[tuple[bytes, bytes]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> RawSubscriber:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="test.ops.sub", daemon=True)
        self._thread.start()
        assert ready.wait(5)
        return self

    def _run(self, ready: threading.Event) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.linger = 0
            sub.subscribe(b"")
            sub.connect(self.endpoint)
            ready.set()
            while not self._stop.is_set():
                if sub.poll(100):
                    topic, payload = sub.recv_multipart()
                    self.frames.append((topic, payload))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def payloads(self, prefix: bytes) -> list[dict]:
        return [json.loads(p) for t, p in list(self.frames) if t.startswith(prefix)]


@dataclass
class Observed:
    """What the test saw over HTTP while the worker ran."""

    healthz: list[tuple[int, dict]] = field(default_factory=list)
    readyz: list[tuple[int, dict]] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    listen_addresses: set[str] = field(default_factory=set)
    via_other_loopback: str = ""  # errno name of a connect to 127.0.0.2, or "connected"


def http_get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=3) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sample(families, name: str, **labels: str) -> float | None:
    for family in families:
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def published(metrics_text: str, stream: str) -> float:
    value = sample(list(text_string_to_metric_families(metrics_text)), "detstream_frames_published_total",
                   stream=stream)
    return value or 0.0


def watch(proc, port: int) -> Observed:
    """Poll the endpoints (bounded) until the clip is published and ready, then look at the socket."""
    seen = Observed()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status, body = http_get(port, "/readyz")
        except OSError:  # not listening yet: the model is still loading
            time.sleep(0.2)
            continue
        seen.readyz.append((status, json.loads(body)))
        status, body = http_get(port, "/healthz")
        seen.healthz.append((status, json.loads(body)))
        seen.metrics.append(http_get(port, "/metrics")[1])
        if seen.readyz[-1][0] == 200 and published(seen.metrics[-1], "clip") > 0:
            break
        time.sleep(0.2)
    seen.listen_addresses = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections("inet")
                             if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    with socket.socket() as probe:  # 127.0.0.2 is this machine too, but not the bound address
        probe.settimeout(3)
        seen.via_other_loopback = errno.errorcode.get(probe.connect_ex(("127.0.0.2", port)), "connected")
    return seen


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_model):
    """One 6 s real-time run with the clip and a dead camera; everything observed, the process always ended."""
    clip = make_clip(tmp_path_factory.mktemp("ops") / "clip.mp4", frames=120, fps=10)
    zmq_port, metrics_port = free_port(), free_port()
    subscriber = RawSubscriber(f"tcp://127.0.0.1:{zmq_port}").start()
    proc = start_detstream("run", "--source", f"clip={clip}", "--source", DEAD_CAMERA,
                           "--publish", f"tcp://127.0.0.1:{zmq_port}", "--metrics-port", str(metrics_port),
                           "--realtime", "--duration", str(RUN_S), "--no-progress", "--log-format", "json",
                           "--models-dir", str(Path(default_model).parent))
    try:
        seen = watch(proc, metrics_port)
        deadline = time.monotonic() + RUN_S + 20
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        code, out, err = stop_process(proc, timeout_s=10)
        time.sleep(0.3)
        subscriber.stop()
    return {"seen": seen, "code": code, "stdout": out, "stderr": err, "sub": subscriber}


def test_the_run_ends_by_itself_after_its_duration_with_exit_0(run):
    assert run["code"] == 0, run["stderr"][-3000:]


def test_readyz_turns_200_once_the_clip_is_running(run):
    seen = run["seen"]
    assert seen.readyz, "the metrics port never answered"
    status, body = seen.readyz[-1]
    assert status == 200, seen.readyz[-3:]
    assert body["sources"]["clip"] == "running"
    assert all(b.get("reason") for s, b in seen.readyz if s == 503)


def test_healthz_is_200_and_published_recently_while_running(run):
    status, body = run["seen"].healthz[-1]
    assert status == 200, run["seen"].healthz[-3:]
    assert body["status"] == "ok" and body["published_recently"] is True


def test_metrics_show_frames_latencies_batches_ring_and_engine(run):
    text = run["seen"].metrics[-1]
    families = list(text_string_to_metric_families(text))
    assert published(text, "clip") > 0
    for stage in ("decode", "queue", "infer", "post", "total"):
        assert sample(families, "detstream_latency_seconds_count", stage=stage) > 0, stage
    assert sample(families, "detstream_batch_size_count") > 0
    assert sample(families, "detstream_ring_occupancy_ratio") is not None
    labels = next(s.labels for f in families for s in f.samples if s.name == "detstream_engine_info")
    assert labels["backend"].startswith("openvino:CPU:") and labels["model"] == "yolov3-tiny"  # auto on a CPU
    assert sample(families, "detstream_source_state", stream="clip", state="running") == 1.0


def test_metrics_give_what_a_frame_costs_in_inference_cpu(run):
    """CPU seconds of the inference runs over frames published: a frame's cost, which rises when the host slows."""
    from app.config import EngineConfig
    from app.engines.onnxruntime import physical_cores

    families = list(text_string_to_metric_families(run["seen"].metrics[-1]))
    cpu_s = sample(families, "detstream_inference_cpu_seconds_total")
    assert cpu_s is not None
    backend = next(s.labels for f in families for s in f.samples if s.name == "detstream_engine_info")["backend"]
    if not backend.startswith("onnxruntime:CPUExecutionProvider"):
        # OpenVINO runs frames on its own stream threads: their CPU is not measured (the counter stays 0); the
        # ONNX Runtime workers' measurement is checked in tests/integration/test_pipeline_inprocess.py too
        assert cpu_s == 0
        pytest.skip(f"{backend} does not measure its inference CPU")
    if physical_cores() // EngineConfig().onnxruntime.workers != 1:
        pytest.skip("runs on several threads each: their CPU is not measured (the counter stays 0)")
    frames = sample(families, "detstream_frames_published_total", stream="clip")
    assert frames and 0.005 < cpu_s / frames < 1.0, (cpu_s, frames)  # yolov3-tiny: tens of ms per frame here


def test_metrics_count_decoded_frames(run):
    families = list(text_string_to_metric_families(run["seen"].metrics[-1]))
    assert sample(families, "detstream_frames_decoded_total", stream="clip") > 0


def test_the_metrics_server_listens_on_127_0_0_1_only(run):
    seen = run["seen"]
    assert seen.listen_addresses == {"127.0.0.1"}
    assert seen.via_other_loopback == "ECONNREFUSED"


def test_logs_on_stderr_are_one_json_object_per_line(run):
    lines = [line for line in run["stderr"].splitlines() if line.strip()]
    assert lines
    entries = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "message"} <= e.keys() for e in entries)
    assert any(e["logger"] == "app.health" for e in entries)


def test_the_camera_password_appears_nowhere(run):
    assert PASSWORD not in run["stderr"] and PASSWORD not in run["stdout"]
    assert "user:***@127.0.0.1:1/x" in run["stderr"], "the dead camera should be logged, masked"
    frames = run["sub"].frames
    assert frames, "no ZeroMQ message arrived"
    assert not [t for t, p in frames if PASSWORD.encode() in t + p]
    seen = run["seen"]
    for body in [*seen.metrics, *(json.dumps(b) for _, b in seen.healthz + seen.readyz)]:
        assert PASSWORD not in body


def test_the_dead_camera_reports_its_state_without_stopping_the_clip(run):
    statuses = run["sub"].payloads(b"status/")
    dead = [s for s in statuses if s["stream"] != "clip"]
    assert dead and {s["state"] for s in dead} <= {"connecting", "reconnecting", "ended", "failed"}
    assert run["sub"].payloads(b"det/clip/")


def test_the_metrics_port_cannot_be_taken_twice(default_model, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        clip = make_clip(tmp_path / "short.mp4", frames=5, fps=10)
        proc = start_detstream("run", "--source", str(clip), "--publish", f"tcp://127.0.0.1:{free_port()}",
                               "--metrics-port", str(port), "--no-progress",
                               "--models-dir", str(Path(default_model).parent))
        try:
            proc.wait(60)
        finally:
            code, _, err = stop_process(proc)
    assert code != 0
    errors = [line for line in err.splitlines() if "detstream: error:" in line]
    assert errors == [f"detstream: error: metrics.port {port}: address already in use"], err[-2000:]
