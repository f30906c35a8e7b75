"""A real publisher on a free loopback port for the subscriber tests."""

from __future__ import annotations

import socket

import pytest

from app.config import PublishConfig
from app.publish.zmq import ZmqPublisher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def endpoint() -> str:
    return f"tcp://127.0.0.1:{_free_port()}"


@pytest.fixture(params=["json", "msgpack"])
def publisher(request, endpoint):
    pub = ZmqPublisher(PublishConfig(endpoint=endpoint, encoding=request.param, linger_ms=500))
    yield pub
    pub.close()
