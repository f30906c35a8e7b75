"""Integration fixtures for sources: the real RTSP server (a factory) and clips made with ffmpeg."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.rtsp import GarbageServer, RtspServer, gst_rtsp_missing, make_clip


@pytest.fixture(scope="session")
def _gst_rtsp_reason() -> str | None:
    return gst_rtsp_missing()


@pytest.fixture
def rtsp_server(_gst_rtsp_reason, tmp_path) -> Iterator[Callable[..., RtspServer]]:
    """A factory: ``rtsp_server({"/cam": "pattern:320x240@10"}, user=..., password=..., loop=...)``.

    Each call starts ``scripts/rtsp_server.py`` on a free loopback port and
    waits (bounded) for READY; every server started is killed at teardown.
    Skips only when /usr/bin/python3 lacks gi/GstRtspServer (``make test``
    installs them, so CI never skips).
    """
    if _gst_rtsp_reason:
        pytest.skip(_gst_rtsp_reason)
    started: list[RtspServer] = []

    def start(mounts: dict[str, str], **kwargs) -> RtspServer:
        server = RtspServer(mounts, **kwargs)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.resume()
        server.kill()


@pytest.fixture(scope="session")
def h264_clip(tmp_path_factory) -> Path:
    """60 frames, 10 fps, 320x240 H.264 MP4 (moov first), made with ffmpeg."""
    return make_clip(tmp_path_factory.mktemp("clips") / "clip60.mp4", frames=60, fps=10)


@pytest.fixture
def garbage_server() -> Iterator[GarbageServer]:
    server = GarbageServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def small_clip(tmp_path_factory) -> Path:
    """A 40-frame 160x120 H.264 test pattern, made once per module."""
    path = tmp_path_factory.mktemp("clips") / "small.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=25",
                    "-frames:v", "40", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)], check=True, timeout=60)
    return path
