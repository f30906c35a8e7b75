"""HealthServer against a fake pipeline: routes, status codes, bind errors, idempotent start/stop."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from app.errors import ConfigError
from app.health import HealthServer
from app.metrics import PipelineMetrics
from app.sources.base import SourceState
from app.stages.results import StreamSnapshot


def snapshot(state: str) -> StreamSnapshot:
    return StreamSnapshot(SourceState(state), "", 0, None, 0, 0, {}, 0.0)


class FakePipeline:
    """The public, read-only state HealthServer reads of a Pipeline."""

    def __init__(self, heartbeat_s: float = 5.0) -> None:
        self.metrics = PipelineMetrics()
        self.ready = threading.Event()
        self.alive = False
        self.last_publish_at: float | None = None
        self.publisher = None
        self.sink_failures: dict[str, str] = {}
        self.config = SimpleNamespace(publish=SimpleNamespace(heartbeat_s=heartbeat_s))
        self._streams: dict[str, StreamSnapshot] = {}

    def streams(self) -> dict[str, StreamSnapshot]:
        return dict(self._streams)

    def begin(self, *states: str) -> None:
        self._streams = {f"s{i}": snapshot(state) for i, state in enumerate(states)}
        self.publisher = SimpleNamespace(sent=0, dropped_hwm=0)
        self.alive = True
        self.last_publish_at = time.monotonic()
        self.ready.set()


def get(server: HealthServer, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


@pytest.fixture
def pipeline() -> FakePipeline:
    return FakePipeline()


@pytest.fixture
def server(pipeline: FakePipeline):
    health = HealthServer(pipeline, "127.0.0.1", 0)
    health.start()
    yield health
    health.stop()


def test_metrics_are_the_pipeline_registry_in_prometheus_text_format(pipeline, server):
    pipeline.metrics.frames_published.labels(stream="gate").inc(3)
    status, content_type, body = get(server, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=")
    assert 'detstream_frames_published_total{stream="gate"} 3.0' in body.decode()


def test_before_the_pipeline_starts_health_and_readiness_say_so(server):
    status, content_type, body = get(server, "/healthz")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body)["status"] == "starting"
    status, _, body = get(server, "/readyz")
    assert status == 503 and json.loads(body)["reason"] == "engine not loaded yet"


def test_a_live_postprocess_thread_with_a_recent_heartbeat_is_healthy(pipeline, server):
    pipeline.begin("connecting")
    status, _, body = get(server, "/healthz")
    reply = json.loads(body)
    assert status == 200
    assert reply["status"] == "ok" and reply["published_recently"] is True


def test_a_dead_postprocess_thread_is_unhealthy(pipeline, server):
    pipeline.begin("running")
    pipeline.alive = False
    status, _, body = get(server, "/healthz")
    assert status == 503 and "postprocess thread" in json.loads(body)["reason"]


def test_nothing_published_for_two_heartbeats_is_unhealthy():
    pipeline = FakePipeline(heartbeat_s=0.1)
    pipeline.begin("running")
    pipeline.last_publish_at = time.monotonic() - 1.0
    health = HealthServer(pipeline, "127.0.0.1", 0)
    health.start()
    try:
        status, _, body = get(health, "/healthz")
        reply = json.loads(body)
        assert status == 503 and reply["published_recently"] is False and "nothing published" in reply["reason"]
        pipeline.last_publish_at = time.monotonic()  # the results stage published again
        assert get(health, "/healthz")[0] == 200
    finally:
        health.stop()


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (("connecting",), 503),
        (("reconnecting", "failed"), 503),
        (("running",), 200),
        (("failed", "running", "ended"), 200),
    ],
)
def test_ready_once_the_engine_is_loaded_and_one_source_is_running(pipeline, server, states, expected):
    pipeline.begin(*states)
    status, _, body = get(server, "/readyz")
    reply = json.loads(body)
    assert status == expected
    assert reply["sources"] == {f"s{i}": state for i, state in enumerate(states)}
    if expected == 503:
        assert reply["reason"].startswith("no source is running")


@pytest.mark.parametrize("path", ["/", "/metrics/../etc/passwd", "/healthz/x", "/admin", "/%2e%2e"])
def test_other_paths_are_404(server, path):
    assert get(server, path)[0] == 404


def test_only_get_is_served(server):
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=5)
    assert error.value.code == 501


def test_a_busy_port_is_a_one_line_config_error(pipeline):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^metrics.port {port}: address already in use$"):
            HealthServer(pipeline, "127.0.0.1", port).start()


def test_a_second_server_on_a_port_in_use_fails_even_with_reuse_address(pipeline, server):
    with pytest.raises(ConfigError, match=rf"^metrics.port {server.port}: address already in use$"):
        HealthServer(pipeline, "127.0.0.1", server.port).start()


def test_the_port_can_be_bound_again_while_old_connections_are_in_time_wait(pipeline):
    first = HealthServer(pipeline, "127.0.0.1", 0)
    first.start()
    port = first.port
    for _ in range(3):
        get(first, "/healthz")  # the server closes these connections: TIME_WAIT on its side
    first.stop()
    second = HealthServer(pipeline, "127.0.0.1", port)
    second.start()
    second.stop()


def test_an_unbindable_host_is_a_config_error(pipeline):
    with pytest.raises(ConfigError, match=r"^metrics.host 192.0.2.1: cannot bind here"):
        HealthServer(pipeline, "192.0.2.1", 0).start()


def test_it_binds_the_configured_host_on_a_named_daemon_thread(pipeline, server):
    assert server._server.server_address[0] == "127.0.0.1"
    threads = [t for t in threading.enumerate() if t.name == "detstream.health"]
    assert len(threads) == 1 and threads[0].daemon


def test_start_and_stop_are_idempotent(pipeline):
    health = HealthServer(pipeline, "127.0.0.1", 0)
    health.start()
    health.start()
    port = health.port
    health.stop()
    health.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert not [t for t in threading.enumerate() if t.name == "detstream.health"]


def test_healthz_names_a_failed_optional_sink_and_stays_200(pipeline, server):
    pipeline.begin("running")
    assert json.loads(get(server, "/healthz")[2])["sink_failures"] == {}
    pipeline.sink_failures = {"annotate": "No space left on device (ENOSPC) writing /out/cam.mp4"}
    status, _, body = get(server, "/healthz")
    assert status == 200, "an optional sink does not make the worker unhealthy"
    assert json.loads(body)["sink_failures"]["annotate"].startswith("No space left on device")
