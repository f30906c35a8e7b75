"""Fixtures shared by every test: the real default model, the real clips, loopback ports, a plain SUB."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """``scripts/NAME.py`` as a module (the scripts are not a package), to test its functions directly."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def default_model() -> Path:
    from app.models.store.registry import ensure_default_model

    return ensure_default_model(ROOT / "models", None)


@pytest.fixture(scope="session")
def vtest() -> Path:
    from app.assets import fetch_clip

    return fetch_clip("vtest.avi", None)


@pytest.fixture(scope="session")
def bikes() -> Path:
    from app.assets import fetch_clip

    return fetch_clip("bikes.mp4", None)


@pytest.fixture
def port() -> int:
    return free_port()


@dataclass
class Collector:
    """A plain pyzmq SUB socket on its own thread, recording (topic, payload) until stopped."""

    endpoint: str
    messages: list[tuple[str, dict]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Collector:
        self._thread = threading.Thread(target=self._run, name="test.sub", daemon=True)
        self._thread.start()
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.linger = 0
            sub.rcvhwm = 0
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(self.endpoint)
            self._ready.set()
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            while not self._stop.is_set():
                if poller.poll(100):
                    topic, payload = sub.recv_multipart()
                    self.messages.append((topic.decode(), json.loads(payload)))

    def stop(self, settle_s: float = 0.5) -> list[tuple[str, dict]]:
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join(5)
        return self.messages

    def detections(self, stream: str | None = None) -> list[dict]:
        return [p for t, p in self.messages if t.startswith("det/") and (stream is None or p["stream"] == stream)]

    def statuses(self, stream: str | None = None) -> list[dict]:
        return [p for t, p in self.messages if t.startswith("status/") and (stream is None or p["stream"] == stream)]


@pytest.fixture
def collector(port):
    c = Collector(f"tcp://127.0.0.1:{port}").start()
    yield c
    c._stop.set()


def detstream(*args: str, timeout_s: float = 240, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess from the repo root, bounded in time."""
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})}, **kwargs)


def start_detstream(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 10) -> tuple[int, str, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return proc.returncode, out, err


def wait_until(predicate, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` has passed (bounded, for tests)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def count_frames(path: Path) -> int:
    """Decoded frames counted independently of detstream (PyAV, all frames)."""
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))
