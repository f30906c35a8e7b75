"""HttpServer: uvicorn on its own thread serving MJPEG to a real HTTP client, a busy port, and a clean stop."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

from app.config import parse_config
from app.errors import ConfigError
from app.http.server import HttpServer
from app.http.settings import HttpConfig
from app.http.view import ViewSink
from app.pipeline import Pipeline
from tests.fakes import FixedEngine, MemoryPublisher


def test_mjpeg_pictures_reach_a_client_and_the_server_stops_with_the_stream_open(small_clip):
    config = parse_config({"sources": [{"id": "s", "url": str(small_clip), "loop": True, "realtime": True}],
                           "engine": {"max_batch": 2, "max_wait_ms": 2}, "publish": {"startup_wait_s": 0}})
    view = ViewSink(lambda: pipeline.spec.class_names, view_fps=10)
    pipeline = Pipeline(config, engine=FixedEngine(), publisher=MemoryPublisher(), sinks=[view])
    server = HttpServer(pipeline, view, HttpConfig(enabled=True, port=0))
    server.start()
    try:
        pipeline.start()
        parts = 0
        with httpx.stream("GET", server.url + "api/sources/s/stream.mjpg", timeout=10) as reply:
            assert reply.headers["content-type"].startswith("multipart/x-mixed-replace")
            buffer = b""
            deadline = time.monotonic() + 10
            for chunk in reply.iter_bytes():
                buffer += chunk
                parts = buffer.count(b"Content-Type: image/jpeg")
                if parts >= 3 or time.monotonic() > deadline:
                    break
        assert parts >= 3 and b"\xff\xd8" in buffer
        def hold_a_stream_open() -> None:  # the server cuts it when it stops: that is the end this test wants
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.url + "api/sources/s/stream.mjpg", timeout=3)

        opened = threading.Thread(target=hold_a_stream_open, daemon=True)
        opened.start()
        time.sleep(0.3)
    finally:
        started = time.monotonic()
        server.stop()
        pipeline.stop()
        pipeline.wait(20)
        pipeline.close()
        view.close()
    assert time.monotonic() - started < 8, "an open picture stream does not hold the stop"
    opened.join(5)
    assert not opened.is_alive()  # the open stream ended with the server (cut or closed), not left hanging


def test_a_busy_port_is_a_config_error_naming_the_address():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = parse_config({"sources": [{"url": "/c/a.mp4"}]})
        pipeline = Pipeline(config, engine=FixedEngine(), publisher=MemoryPublisher())
        server = HttpServer(pipeline, ViewSink(lambda: ()), HttpConfig(enabled=True, port=port))
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} \\(.*address already in use"):
            server.start()
