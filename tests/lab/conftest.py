"""Fixtures the lab's tests share with the integration tests (the RTSP server check)."""

from tests.integration.conftest import _gst_rtsp_reason  # noqa: F401 - a fixture, used by name
