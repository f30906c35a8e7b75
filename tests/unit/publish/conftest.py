"""Loopback helpers for the publish tests: free ports and a context closed after each test."""

from __future__ import annotations

import socket

import pytest
import zmq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def make_endpoint():
    """Returns a function giving a fresh loopback endpoint per call."""
    return lambda: f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)  # the test thread owns every socket made from it
