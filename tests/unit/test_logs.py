"""Logging: readable text or JSON lines on stderr, and never a camera password, whatever logs it."""

from __future__ import annotations

import json
import logging

import pytest

from app.logs import setup_logging

URL = "rtsp://admin:s3cretPW@10.0.0.5:554/stream1"
MASKED = "rtsp://admin:***@10.0.0.5:554/stream1"


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def emit(capsys, fmt: str, log) -> str:
    setup_logging("DEBUG", fmt)
    log(logging.getLogger("detstream.test"))
    return capsys.readouterr().err


def raise_with_url() -> None:
    try:
        raise ConnectionError(f"cannot open {URL}: connection refused")
    except ConnectionError as error:
        raise RuntimeError(f"source gate failed after retries on {URL}") from error


def test_text_lines_carry_time_level_logger_and_message(capsys):
    err = emit(capsys, "text", lambda log: log.info("source %s running", "gate"))
    line, = err.splitlines()
    assert line.endswith("INFO    detstream.test: source gate running")


def test_json_lines_are_one_object_each_with_the_standard_keys(capsys):
    def log(logger: logging.Logger) -> None:
        logger.info("source %s running", "gate", extra={"source_id": "gate"})
        logger.warning("plain")

    first, second = (json.loads(line) for line in emit(capsys, "json", log).splitlines())
    assert first["message"] == "source gate running" and first["source_id"] == "gate"
    assert {"ts", "time", "level", "logger", "thread"} <= first.keys()
    assert (first["level"], first["logger"], first["thread"]) == ("INFO", "detstream.test", "MainThread")
    assert second["level"] == "WARNING" and "source_id" not in second


def test_setup_logging_replaces_handlers_and_sets_the_level(capsys):
    setup_logging("INFO", "text")
    setup_logging("WARNING", "json")
    assert len(logging.getLogger().handlers) == 1
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["message"] == "shown"


PASSWORD_IN_MESSAGE = [
    pytest.param(lambda log: log.info("opening %s", URL), id="as-argument"),
    pytest.param(lambda log: log.info(f"opening {URL}"), id="in-the-format-string"),
    pytest.param(lambda log: log.warning("sources: %r", {"gate": URL}), id="inside-a-repr"),
    pytest.param(lambda log: log.error("failed: %s", ConnectionError(URL)), id="in-an-exception-argument"),
    pytest.param(lambda log: log.info("two: %s and %s", URL, URL.replace("admin", "viewer")), id="twice"),
    pytest.param(lambda log: logging.getLogger("libav.rtsp").error("%s: 401", URL), id="from-a-library-logger"),
]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("log", PASSWORD_IN_MESSAGE)
def test_a_password_in_a_log_message_is_masked(capsys, fmt, log):
    err = emit(capsys, fmt, log)
    assert "s3cretPW" not in err
    assert "admin:***@10.0.0.5" in err or "viewer:***@" in err
    if fmt == "json":
        assert all(json.loads(line) for line in err.splitlines())


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_password_in_an_exception_traceback_is_masked(capsys, fmt):
    def log(logger: logging.Logger) -> None:
        try:
            raise_with_url()
        except RuntimeError:
            logger.exception("decoder for %s crashed", URL)

    err = emit(capsys, fmt, log)
    assert "s3cretPW" not in err
    assert err.count(MASKED) >= 3  # the message, the exception and its cause
    assert "Traceback (most recent call last)" in err and "ConnectionError" in err
    if fmt == "json":
        entry, = (json.loads(line) for line in err.splitlines())
        assert entry["level"] == "ERROR" and MASKED in entry["exception"] and "s3cretPW" not in entry["exception"]


def test_exc_info_on_a_warning_is_masked_too(capsys):
    def log(logger: logging.Logger) -> None:
        try:
            raise_with_url()
        except RuntimeError as error:
            logger.warning("reconnecting", exc_info=error)

    err = emit(capsys, "text", log)
    assert "s3cretPW" not in err and MASKED in err


def test_a_url_without_password_is_left_as_it_is(capsys):
    err = emit(capsys, "text", lambda log: log.info("opening %s and %s", "rtsp://admin@cam/x", "http://cam/x?a=b"))
    assert "rtsp://admin@cam/x and http://cam/x?a=b" in err


def test_messages_with_percent_signs_survive_masking(capsys):
    err = emit(capsys, "text", lambda log: log.info("%s at 100%% load", URL))
    assert err.rstrip().endswith(f"{MASKED} at 100% load")
