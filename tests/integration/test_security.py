"""Security: credentials never leave the process, sockets bind loopback by default, clients survive garbage.

A camera password (``S3cretPw``) is put in RTSP URLs of a reachable camera
(the GStreamer server with authentication), of the same camera with a wrong
password, and of an unreachable one. Everything the worker emits is then
searched for it: stdout and stderr (text logs at DEBUG and JSON logs), every
ZeroMQ frame, /metrics, /healthz, /readyz and ``detstream config check``.
A second run takes a password with every URL-special character from
``${CAM_PW}`` (percent-encoded into the URL by detstream): it must connect,
and no 4-character piece of it may appear anywhere.

What already exists elsewhere and is not repeated: the hypothesis fuzz of the
config loader (tests/unit/test_config.py) and of the payload decoder
(tests/unit/publish/test_messages.py), masking in log records
(tests/unit/test_logs.py) and in source statuses (test_sources_rtsp.py), and
the metrics socket on 127.0.0.1 only (test_ops.py). Added here: the run as a
whole, the subscriber's handling of garbage on the wire (a fuzz of payload
fields and ``detstream subscribe`` against a raw PUB sending random frames).
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote

import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import DetstreamConfig
from app.publish.messages import decode, encode, status_payload
from app.subscribe.messages import DetectionMessage, StatusMessage
from app.subscribe.render import format_counts, table_row
from tests.conftest import ROOT, detstream, free_port, start_detstream, stop_process
from tests.integration.rtsp import GarbageServer, dead_port

SECRET = "S3cretPw"
RAW_AT_SECRET = "Secret9"  # in ``admin:Raw@Secret9@host``: FFmpeg takes the LAST '@' as the end of the password
RUN_S = 6.0


@dataclass
class Exposure:
    """Everything one run let out."""

    stdout: str = ""
    stderr: str = ""
    frames: list[bytes] = field(default_factory=list)
    http: list[str] = field(default_factory=list)
    listening: set[tuple[str, int]] = field(default_factory=set)
    code: int = -1

    def texts(self) -> dict[str, str]:
        return {"stdout": self.stdout, "stderr": self.stderr, "zmq": repr(self.frames), "http": "\n".join(self.http)}


class RawFrames:
    """A SUB socket on its own thread keeping every frame as bytes."""

    def __init__(self, endpoint: str) -> None:
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(endpoint, ready), name="test.raw", daemon=True)
        self._thread.start()
        assert ready.wait(5)

    def _run(self, endpoint: str, ready: threading.Event) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.linger = 0
            sub.subscribe(b"")
            sub.connect(endpoint)
            ready.set()
            while not self._stop.is_set():
                if sub.poll(100):
                    self.frames.extend(sub.recv_multipart())

    def stop(self) -> list[bytes]:
        time.sleep(0.3)
        self._stop.set()
        self._thread.join(5)
        return self.frames


def http_text(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.read().decode()
    except OSError:
        return None


def watch(proc: subprocess.Popen, metrics_port: int, exposure: Exposure) -> None:
    """Scrape the HTTP endpoints and look at the listening sockets until the run ends (bounded)."""
    deadline = time.monotonic() + RUN_S + 60
    while proc.poll() is None and time.monotonic() < deadline:
        for path in ("/metrics", "/healthz", "/readyz"):
            text = http_text(metrics_port, path)
            if text is not None:
                exposure.http.append(text)
        try:
            exposure.listening |= {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid).net_connections("inet")
                                   if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            break
        time.sleep(0.5)


@pytest.fixture(scope="module")
def camera(_gst_rtsp_reason):
    if _gst_rtsp_reason:
        pytest.skip(_gst_rtsp_reason)
    from tests.integration.rtsp import RtspServer

    server = RtspServer({"/x": "pattern:320x240@5"}, user="admin", password=SECRET).start()
    yield server
    server.kill()


def secret_sources(camera) -> list[str]:
    dead = dead_port()
    return [f"good=rtsp://admin:{SECRET}@127.0.0.1:{camera.port}/x",
            f"wrong=rtsp://admin:{SECRET}x@127.0.0.1:{camera.port}/x",
            f"gone=rtsp://admin:{SECRET}@127.0.0.1:{dead}/x",
            f"rawat=rtsp://admin:Raw@{RAW_AT_SECRET}@127.0.0.1:{dead}/y"]


def expose(camera, *global_options: str) -> Exposure:
    zmq_port, metrics_port = free_port(), free_port()
    raw = RawFrames(f"tcp://127.0.0.1:{zmq_port}")
    args = [*global_options, "run", "--publish", f"tcp://127.0.0.1:{zmq_port}", "--metrics-port", str(metrics_port),
            "--duration", str(RUN_S), "--no-progress"]
    for source in secret_sources(camera):
        args += ["--source", source]
    return observe(raw, metrics_port, *args)


def observe(raw: RawFrames, metrics_port: int, *args: str, env: dict | None = None) -> Exposure:
    """Run ``detstream *args`` for its duration, watching /metrics and the raw frames; what it exposed."""
    proc = start_detstream(*args, env=env)
    exposure = Exposure()
    try:
        watch(proc, metrics_port, exposure)
    finally:
        exposure.code, exposure.stdout, exposure.stderr = stop_process(proc, timeout_s=15)
        exposure.frames = raw.stop()
    return exposure


@pytest.fixture(scope="module", params=["text-debug", "json"])
def exposure(request, camera, default_model) -> Exposure:
    options = ("--log-level", "DEBUG") if request.param == "text-debug" else ("--log-format", "json")
    return expose(camera, *options)


def test_the_run_worked_so_there_was_something_to_leak(exposure):
    assert exposure.code == 0, exposure.stderr[-2000:]
    assert any(f.startswith(b"det/good/") for f in exposure.frames), "the authenticated camera published nothing"
    assert any(b"401 Unauthorized" in f for f in exposure.frames), "the wrong password was not reported"
    assert any(b"refused" in f for f in exposure.frames), "the unreachable camera was not reported"
    assert any("detstream_frames_published_total" in text for text in exposure.http)
    assert "admin:***@127.0.0.1" in exposure.stderr


def test_the_password_appears_in_no_output_log_message_or_endpoint(exposure):
    leaks = {name: text.count(SECRET) for name, text in exposure.texts().items() if SECRET in text}
    assert not leaks, leaks


def test_a_password_containing_a_raw_at_sign_appears_nowhere(exposure):
    leaks = {name: text.count(RAW_AT_SECRET) for name, text in exposure.texts().items() if RAW_AT_SECRET in text}
    assert not leaks, leaks


def test_every_listening_socket_of_the_worker_is_on_127_0_0_1(exposure):
    assert exposure.listening, "no listening socket was seen"
    assert {ip for ip, _ in exposure.listening} == {"127.0.0.1"}, exposure.listening


def test_the_defaults_bind_loopback_only():
    config = DetstreamConfig(sources=[{"url": "a.mp4"}])
    assert config.metrics.host == "127.0.0.1"
    assert config.publish.endpoint.startswith("tcp://127.0.0.1:")


def test_config_check_masks_the_password_written_in_the_file_and_from_the_environment(tmp_path):
    file = tmp_path / "cams.yaml"
    file.write_text(f"sources:\n  - id: a\n    url: rtsp://admin:{SECRET}@10.0.0.5/s\n"
                    "  - id: b\n    url: rtsp://admin:${CAM_PW}@10.0.0.6/s\n")
    for options in ((), ("--log-format", "json"), ("--log-level", "DEBUG")):
        result = detstream(*options, "config", "check", str(file), env={"CAM_PW": SECRET}, timeout_s=60)
        assert result.returncode == 0, result.stderr
        assert SECRET not in result.stdout + result.stderr
        assert result.stdout.count("admin:***@") == 2


# -- a password with every URL-special character, from the environment ----------------------------------------------

SPECIAL = "Hk4:/?#[]@!$&'()*+,;=% Zv"  # interpolated from ${CAM_PW}; percent-encoded into the URL by detstream


def fragments(secret: str, size: int = 4) -> set[str]:
    forms = {secret, quote(secret, safe="")}
    return {form[i:i + size] for form in forms for i in range(len(form) - size + 1)}


@pytest.fixture(scope="module")
def special_exposure(_gst_rtsp_reason, default_model, tmp_path_factory) -> Exposure:
    if _gst_rtsp_reason:
        pytest.skip(_gst_rtsp_reason)
    from tests.integration.rtsp import RtspServer

    server = RtspServer({"/x": "pattern:320x240@5"}, user="admin", password=SPECIAL).start()
    zmq_port, metrics_port = free_port(), free_port()
    file = tmp_path_factory.mktemp("special") / "cams.yaml"
    file.write_text(f"sources:\n  - id: good\n    url: rtsp://admin:${{CAM_PW}}@127.0.0.1:{server.port}/x\n"
                    f"  - id: wrong\n    url: rtsp://admin:${{CAM_PW_WRONG}}@127.0.0.1:{server.port}/x\n"
                    f"  - id: gone\n    url: rtsp://${{CAM_CREDS}}@127.0.0.1:{dead_port()}/x\n"
                    f"publish:\n  endpoint: tcp://127.0.0.1:{zmq_port}\n")
    env = {"CAM_PW": SPECIAL, "CAM_PW_WRONG": SPECIAL + "x", "CAM_CREDS": f"admin:{SPECIAL}"}
    raw = RawFrames(f"tcp://127.0.0.1:{zmq_port}")
    try:
        exposure = observe(raw, metrics_port, "--log-level", "DEBUG", "run", str(file), "--metrics-port",
                           str(metrics_port), "--duration", str(RUN_S), "--no-progress", env=env)
    finally:
        server.kill()
    check = detstream("--log-level", "DEBUG", "config", "check", str(file), env=env, timeout_s=60)
    exposure.http.append(check.stdout + check.stderr)
    return exposure


def test_a_password_with_every_url_special_character_connects(special_exposure):
    assert special_exposure.code == 0, special_exposure.stderr[-2000:]
    assert any(f.startswith(b"det/good/") for f in special_exposure.frames), special_exposure.stderr[-2000:]
    assert any(b"401 Unauthorized" in f for f in special_exposure.frames), "the wrong password was not reported"
    assert "admin:***@127.0.0.1" in special_exposure.stderr


def test_no_piece_of_a_password_with_every_url_special_character_leaks(special_exposure):
    leaks = {name: sorted(piece for piece in fragments(SPECIAL) if piece in text)
             for name, text in special_exposure.texts().items()}
    assert not any(leaks.values()), leaks


# -- the subscriber against garbage on the wire -------------------------------------------------------------------

def _valid_payloads() -> tuple[dict, dict]:
    status = status_payload("gate", "running", "ok", 0, None, frames=1, dropped=0, at=1.7e9)
    detection = {"schema": "detstream.detections/1", "stream": "gate", "seq": 3, "pts": 0.3, "captured_at": 1.7e9,
                 "published_at": 1.7e9, "width": 640, "height": 480, "dropped_before": 0,
                 "latency_ms": {"decode": 1.0, "queue": 1.0, "infer": 1.0, "post": 1.0, "total": 4.0},
                 "model": "m", "engine": "e", "detections": [
                     {"label": "person", "class_id": 0, "score": 0.5, "box": [1, 2, 3, 4], "track_id": None}]}
    return detection, status


def _paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    found = []
    for key, value in tree.items():
        found.append((*prefix, key))
        if isinstance(value, dict):
            found += _paths(value, (*prefix, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    found += _paths(item, (*prefix, key, index))
    return found


DETECTION, STATUS = _valid_payloads()
FIELDS = [("det", p) for p in _paths(DETECTION)] + [("status", p) for p in _paths(STATUS)]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**400), 10**400) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES, encoding=st.sampled_from(["json", "msgpack"]))
def test_any_value_in_any_field_is_either_a_typed_message_or_a_clean_value_error(field, value, encoding):
    kind, path = field
    payload = copy.deepcopy(DETECTION if kind == "det" else STATUS)
    node = payload
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    try:
        data = encode(payload, encoding)
    except (ValueError, OverflowError, TypeError):  # msgpack cannot carry ints beyond 64 bits: not on the wire
        return
    try:
        message = (DetectionMessage if kind == "det" else StatusMessage).from_payload(decode(data, encoding))
    except ValueError:
        return
    table_row(message)
    message.to_payload()
    if isinstance(message, DetectionMessage):
        format_counts(message)


def _garbage_messages(rng: random.Random) -> list[list[bytes]]:
    detection, status = _valid_payloads()
    huge_int = json.dumps(status).replace("1700000000.0", "1" + "0" * 400).encode()
    return [
        [rng.randbytes(rng.randint(0, 64))],
        [b"det/gate/", rng.randbytes(rng.randint(0, 512))],
        [b"status/gate/", rng.randbytes(rng.randint(0, 512))],
        [b"det/gate/", b"{", b"extra"],
        [b"det/gate/", b"[1, 2, 3]"],
        [b"det/gate/", b"\xc1\xff\x00"],
        [b"det/gate/", json.dumps({**detection, "seq": -1}).encode()],
        [b"det/gate/", json.dumps({**detection, "detections": [{"box": "x"}]}).encode()],
        [b"status/gate/", huge_int],
        [b"status/gate/", json.dumps({**status, "state": ["running"]}).encode()],
        [b"status/gate/", b"{" * 100_000],
        [b"other/topic/", json.dumps(status).encode()],
        [rng.randbytes(16), rng.randbytes(16), rng.randbytes(16)],
    ]


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_detstream_subscribe_survives_random_frames_on_the_wire_and_prints_the_valid_message(fmt):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    rng = random.Random(5)
    detection, _ = _valid_payloads()
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as pub:
        pub.linger = 0
        pub.bind(endpoint)
        proc = subprocess.Popen([sys.executable, "-m", "app", "subscribe", endpoint, "--format", fmt, "--count", "1",
                                 "--timeout", "20"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env=dict(os.environ))
        try:
            deadline = time.monotonic() + 20
            while proc.poll() is None and time.monotonic() < deadline:
                for message in _garbage_messages(rng):
                    pub.send_multipart(message)
                pub.send_multipart([b"det/gate/", encode(detection, "json")])
                time.sleep(0.05)
        finally:
            code, out, err = stop_process(proc, timeout_s=5)
    assert "Traceback" not in err, err[-2000:]
    assert code == 0, err[-2000:]
    assert "gate" in out
    assert "skipped a message" in err


def test_detstream_subscribe_against_a_server_that_is_not_zeromq_times_out_cleanly():
    server = GarbageServer()
    try:
        result = detstream("subscribe", f"tcp://127.0.0.1:{server.port}", "--timeout", "2", timeout_s=30)
    finally:
        server.close()
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_an_id_derived_from_a_url_with_credentials_carries_neither_user_nor_password():
    config = DetstreamConfig(sources=[{"url": f"rtsp://admin:{SECRET}@10.0.0.5/stream1"}])
    assert SECRET not in config.sources[0].id and "admin" not in config.sources[0].id
