"""What av.open is given per source kind, and how open failures are named (no network, no disk)."""

from __future__ import annotations

import errno

import av
import pytest

from app.config import SourceConfig
from app.sources.failures import FailureKind
from app.sources.opening import file_path, plan_open, source_error


@pytest.mark.parametrize(("url", "extra", "target", "fmt", "options"), [
    ("rtsp://u:p@cam/s", {}, "rtsp://u:p@cam/s", None,
     {"rtsp_transport": "tcp", "timeout": "11000000", "analyzeduration": "1000000"}),
    ("rtsps://cam/s", {"transport": "udp", "stall_timeout_s": 3}, "rtsps://cam/s", None,
     {"rtsp_transport": "udp", "timeout": "11000000", "analyzeduration": "1000000"}),
    ("rtsp://cam/s", {"open_timeout_s": 30, "read_timeout_s": 2}, "rtsp://cam/s", None,
     {"rtsp_transport": "tcp", "timeout": "31000000", "analyzeduration": "1000000"}),
    ("https://cdn/live/index.m3u8", {"read_timeout_s": 2, "open_timeout_s": 4, "stall_timeout_s": 3},
     "https://cdn/live/index.m3u8", None, {"rw_timeout": "5000000"}),
    ("/dev/video0", {}, "/dev/video0", "v4l2", {}),
    ("clips/a b.mp4", {}, "clips/a b.mp4", None, {}),
    ("file:///data/a%20b.mp4", {}, "/data/a b.mp4", None, {}),
])
def test_each_kind_gets_its_target_format_and_options(url, extra, target, fmt, options):
    plan = plan_open(SourceConfig(id="s", url=url, **extra))
    assert (plan.target, plan.format, plan.options) == (target, fmt, options)


def test_network_reads_time_out_at_the_stall_timeout_when_it_is_shorter():
    plan = plan_open(SourceConfig(id="s", url="rtsp://cam/s", read_timeout_s=10, stall_timeout_s=4, open_timeout_s=7))
    assert (plan.open_timeout_s, plan.read_timeout_s) == (7, 4)
    assert int(plan.options["timeout"]) > 10_000_000  # the socket backstop never ends a phase first


def test_the_open_timeout_is_not_cut_short_by_a_shorter_read_timeout():
    plan = plan_open(SourceConfig(id="s", url="rtsp://cam/s", open_timeout_s=30, read_timeout_s=1, stall_timeout_s=2))
    assert (plan.open_timeout_s, plan.read_timeout_s) == (30, 1)
    assert int(plan.options["timeout"]) > 30_000_000
    file_plan = plan_open(SourceConfig(id="f", url="a.mp4", read_timeout_s=10, stall_timeout_s=4))
    assert file_plan.read_timeout_s == 10


def test_file_urls_become_paths():
    assert file_path("file:///tmp/x.mp4") == "/tmp/x.mp4"
    assert file_path("relative/x.mp4") == "relative/x.mp4"


def _raised(code: int, url: str) -> BaseException:
    try:
        av.error.err_check(code, url)
    except Exception as exc:
        return exc
    raise AssertionError


def test_an_open_failure_names_the_redacted_url_kind_and_cause_in_one_line():
    config = SourceConfig(id="s", url="rtsp://admin:hunter2@127.0.0.1:1/s")
    error = source_error(config, _raised(-errno.ECONNREFUSED, config.url), "open")
    assert str(error) == "rtsp://admin:***@127.0.0.1:1/s: refused: Connection refused"
    assert (error.kind, error.retryable) == (FailureKind.REFUSED.value, True)


def test_an_open_that_ran_out_of_time_is_a_timeout_whatever_ffmpeg_returned():
    config = SourceConfig(id="s", url="rtsp://127.0.0.1:1/s")
    error = source_error(config, _raised(-av.error.tag_to_code(b"INDA"), config.url), "open", timed_out=True)
    assert error.kind == FailureKind.TIMEOUT.value
    assert str(error) == ("rtsp://127.0.0.1:1/s: timeout: no answer to OPTIONS/DESCRIBE/PLAY within 10 s "
                          "(open_timeout_s)")


def test_a_file_that_is_not_a_video_says_so_with_its_name():
    config = SourceConfig(id="s", url="notes.txt")
    error = source_error(config, _raised(-av.error.tag_to_code(b"INDA"), "notes.txt"), "open")
    assert str(error) == "notes.txt: not a video (Invalid data found when processing input)"
    assert error.kind == FailureKind.CORRUPT.value
