"""Credentials with every URL-special character: masked by parsing, in linear time, wherever they appear.

A password interpolated from ``${VAR}`` is percent-encoded into the URL (so it
parses and connects) and is a secret everywhere: `config check` output, status
payloads and log records never hold it, nor any 4-character piece of it.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import quote, unquote, urlsplit

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import masked_dump, parse_config
from app.logs import RedactingFilter
from app.publish.messages import status_payload
from app.redact import forget_secrets, redact_url
from app.sources.opening import plan_open

SPECIALS = ":/?#[]@!$&'()*+,;=% \"<>\\^`{|}~"
# One secret per special character, each unlike anything detstream prints, plus all of them at once.
PASSWORDS = [f"Qz{c}Xw9{c}Kv" for c in SPECIALS] + ["hunter2/x", "p@ss:w/rd%", f"Jq7{SPECIALS}Vb3"]

@pytest.fixture(autouse=True)
def _own_secrets():
    """Secrets registered by one test's config must not mask another test's text."""
    yield
    forget_secrets()



def fragments(secret: str, size: int = 4) -> set[str]:
    return {secret[i:i + size] for i in range(len(secret) - size + 1)}


def leaked(secret: str, text: str) -> set[str]:
    return {piece for piece in fragments(secret) | fragments(quote(secret, safe="")) if piece in text}


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_raw_password_with_url_special_characters_is_masked_whole(password):
    if any(c in password for c in " '\"\\<>^`{|}"):
        pytest.skip("not a URL character when written raw")  # covered below, through ${VAR}
    text = f"source gate: rtsp://admin:{password}@10.0.0.5:554/s1 failed"
    assert redact_url(text) == "source gate: rtsp://admin:***@10.0.0.5:554/s1 failed"


@pytest.mark.parametrize("password", PASSWORDS)
def test_an_interpolated_password_is_percent_encoded_so_the_url_parses(password):
    config = parse_config({"sources": [{"id": "gate", "url": "rtsp://admin:${CAM_PW}@10.0.0.5:554/s1"}]},
                          env={"CAM_PW": password})
    url = config.sources[0].url
    parts = urlsplit(url)
    assert (parts.hostname, parts.port, parts.path) == ("10.0.0.5", 554, "/s1")
    assert unquote(parts.password) == password
    assert plan_open(config.sources[0]).target == url  # what av.open receives


@pytest.mark.parametrize("password", PASSWORDS)
def test_an_interpolated_password_leaves_no_piece_in_dump_status_or_log(password, caplog):
    config = parse_config({"sources": [{"id": "gate", "url": "rtsp://admin:${CAM_PW}@10.0.0.5/s1"},
                                       {"id": "yard", "url": "rtsp://${CAM_CREDS}@10.0.0.6/s1"}]},
                          env={"CAM_PW": password, "CAM_CREDS": f"viewer:{password}"})
    source = config.sources[0]
    dump = masked_dump(config)
    assert "rtsp://admin:***@10.0.0.5/s1" in dump and "rtsp://viewer:***@10.0.0.6/s1" in dump
    assert not leaked(password, dump), dump
    reason = f"{source.url}: auth: 401 Unauthorized (sent {password!r} decoded from {source.url})"
    payload = status_payload("gate", "reconnecting", reason, attempt=1, retry_in_s=0.5, frames=0, dropped=0, at=1.0)
    assert not leaked(password, payload["reason"]), payload["reason"]
    record = logging.LogRecord("detstream", logging.WARNING, __file__, 1, "source %s: %s (password %s)",
                               ("gate", source.url, password), None)
    RedactingFilter().filter(record)
    assert not leaked(password, record.getMessage()), record.getMessage()
    assert "admin:***@10.0.0.5" in record.getMessage()


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=4, max_size=24))
@settings(max_examples=150, deadline=None)
def test_any_interpolated_password_is_masked_in_the_dump(password):
    try:
        config = parse_config({"sources": [{"id": "gate", "url": "rtsps://admin:${PW}@cam.local:322/live"}]},
                              env={"PW": password})
    finally:
        forget_secrets()  # one example's password must not mask the next one's dump
    assert yaml.safe_load(masked_dump(config))["sources"][0]["url"] == "rtsps://admin:***@cam.local:322/live"


def test_a_user_name_alone_and_a_path_with_an_at_sign_stay_readable():
    assert redact_url("rtsp://viewer@cam/live") == "rtsp://viewer@cam/live"
    assert redact_url("https://host/a:b@c and file:///x@y") == "https://host/a:b@c and file:///x@y"
    assert redact_url("two: 'rtsp://a:p/w@h1/x' \"http://b:q@w@h2/y\"") == \
        "two: 'rtsp://a:***@h1/x' \"http://b:***@h2/y\""


@pytest.mark.parametrize("text", [
    "a" * 100_000,
    "a://" * 25_000,
    "rtsp://u:" + "@" * 100_000,
    "rtsp://u:" + "p" * 100_000 + "@host/x",
    ("x" * 50 + "://") * 2_000,
    "rtsp://u:pw@h " * 7_000,
])
def test_redaction_is_linear_in_the_length_of_the_text(text):
    started = time.perf_counter()
    redacted = redact_url(text)
    took = time.perf_counter() - started
    assert took < 0.25, f"{took:.2f} s for {len(text)} characters"
    assert "pw@" not in redacted and ("p" * 1000) not in redacted
