"""Every number and string of the non-engine sections has a bound, and an error line stays short.

Values that validation used to accept and the run then crashed or hung on
(``linger_ms: 1e30`` → OverflowError, ``heartbeat_s: .inf``, a 100,000-character
id or path) are refused with the field path; an error line quotes at most
about 200 characters of a bad value or key; two sources reading the same URL
are legal but warned about.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import config as config_module
from app.config import parse_config
from app.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
MAX_SHOWN_CHARS = 200  # what an error line may quote of a bad value
MAX_LINE = 3 * MAX_SHOWN_CHARS + 200  # path + message + quoted value, each shortened

# field -> the largest value a deployment may use
SOURCE_FIELDS = {"max_fps": 1000.0, "open_timeout_s": 86_400.0, "read_timeout_s": 86_400.0,
                 "stall_timeout_s": 86_400.0, "max_staleness_ms": 86_400_000.0}
BACKOFF_FIELDS = {"initial_s": 86_400.0, "max_s": 86_400.0, "multiplier": 100.0, "reset_after_s": 86_400.0}
PUBLISH_FIELDS = {"sndhwm": 10_000_000, "linger_ms": 60_000, "heartbeat_s": 86_400.0, "startup_wait_s": 60.0}


def tree_with(path: str, value: object) -> dict:
    section, _, field = path.rpartition(".")
    tree: dict = {"sources": [{"id": "a", "url": "clips/a.mp4"}]}
    if not section:
        tree[field] = value
    elif section == "sources[0]":
        tree["sources"][0][field] = value
    elif section == "sources[0].reconnect":
        tree["sources"][0]["reconnect"] = {field: value}
    else:
        tree[section] = {field: value}
    return tree


def all_paths() -> dict[str, float]:
    paths = {f"sources[0].{k}": v for k, v in SOURCE_FIELDS.items()}
    paths |= {f"sources[0].reconnect.{k}": v for k, v in BACKOFF_FIELDS.items()}
    paths |= {f"publish.{k}": v for k, v in PUBLISH_FIELDS.items()}
    paths |= {"metrics.port": 65535, "annotate.snapshots": 1000, "duration_s": 366 * 86_400.0}
    return paths


def parse_path(path: str, value: object):
    return parse_config(tree_with(path, value), env={})


EXTREMES = [10**30, 1e308, math.inf, -math.inf, math.nan, "1e30", ".inf"]


@pytest.mark.parametrize("path", sorted(all_paths()))
@pytest.mark.parametrize("value", EXTREMES, ids=["1e30-int", "1e308", "inf", "-inf", "nan", "str-1e30", "str-inf"])
def test_an_extreme_value_of_any_number_is_refused_naming_its_field(path, value):
    with pytest.raises(ConfigError) as error:
        parse_path(path, value)
    message = str(error.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message and len(message) < MAX_LINE


@pytest.mark.parametrize("field", ["open_timeout_s", "read_timeout_s", "stall_timeout_s"])
def test_a_timeout_too_short_to_ever_succeed_is_refused(field):
    parse_path(f"sources[0].{field}", 0.1)
    with pytest.raises(ConfigError, match=rf"^sources\[0\]\.{field}: "):
        parse_path(f"sources[0].{field}", 1e-9)


@pytest.mark.parametrize("path", sorted(all_paths()))
def test_the_largest_value_a_deployment_needs_is_accepted(path):
    largest = all_paths()[path]
    parse_path(path, largest)
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: "):
        parse_path(path, largest * 2 if isinstance(largest, float) else largest + 1)


@pytest.mark.parametrize(("tree", "path"), [
    ({"sources": [{"id": "x" * 100_000, "url": "a.mp4"}]}, "sources[0].id"),
    ({"sources": [{"id": "x" * 65, "url": "a.mp4"}]}, "sources[0].id"),
    ({"sources": [{"url": "rtsp://u:pw@host/" + "p" * 100_000}]}, "sources[0].url"),
    ({"sources": [{"url": "a.mp4"}], "annotate": {"dir": "/tmp/" + "d" * 100_000}}, "annotate.dir"),
    ({"sources": [{"url": "a.mp4"}], "publish": {"endpoint": "tcp://" + "h" * 100_000 + ":5555"}},
     "publish.endpoint"),
    ({"sources": [{"url": "a.mp4"}], "metrics": {"host": "h" * 100_000}}, "metrics.host"),
    ({"sources": [{"url": "a.mp4"}], "publish": {"curve": {"server_secret_file": "k" * 100_000}}},
     "publish.curve.server_secret_file"),
])
def test_a_huge_string_is_refused_quickly_with_a_short_line(tree, path):
    started = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        parse_config(tree, env={})
    assert time.perf_counter() - started < 1.0
    message = str(error.value)
    assert message.startswith(f"{path}: ") and len(message) < MAX_LINE, message[:500]
    assert "characters)" in message or "x" * 65 in message  # says how long the value was


def test_an_unknown_5000_character_key_is_not_echoed_whole():
    key = "k" * 5000
    with pytest.raises(ConfigError) as error:
        parse_config({"sources": [{"url": "a.mp4"}], "publish": {key: 1}, key: {"x": 1}}, env={})
    message = str(error.value)
    assert len(message) < 2 * MAX_LINE and "k" * 100 not in message, message[:500]
    assert "Extra inputs are not permitted" in message


@pytest.mark.parametrize("key", ["\n", "a\r\nb", "tab\there", "nul\x00"])
def test_an_unknown_key_with_control_characters_is_reported_on_one_line(key):
    with pytest.raises(ConfigError) as caught:
        parse_config({"sources": [{"url": "a.mp4"}], "publish": {key: 1}}, env={})
    text = str(caught.value)
    assert text.isprintable(), repr(text)
    assert text.startswith("publish.") and "Extra inputs are not permitted" in text


def test_an_unset_variable_under_a_huge_key_is_reported_short():
    with pytest.raises(ConfigError) as error:
        parse_config({"sources": [{"url": "a.mp4"}], "k" * 5000: "${NOT_SET}"}, env={})
    assert len(str(error.value)) < MAX_LINE and "NOT_SET" in str(error.value)


def test_a_secret_in_a_long_bad_value_is_masked_before_the_value_is_cut():
    url = "rtsp://admin:" + "S3cretPw" * 30 + "@" + "h" * 5000  # host too long for the URL bound
    with pytest.raises(ConfigError) as error:
        parse_config({"sources": [{"url": url}]}, env={})
    assert "S3cretPw" not in str(error.value)


def test_two_sources_with_the_same_url_get_one_warning_naming_both():
    config = parse_config({"sources": [{"id": "front", "url": "rtsp://u:pw@cam/live"},
                                       {"id": "door", "url": "rtsp://u:pw@cam/live"},
                                       {"id": "yard", "url": "rtsp://u:pw@cam2/live"}]}, env={})
    warnings = config_module.config_warnings(config)
    assert len(warnings) == 1 and "'front'" in warnings[0] and "'door'" in warnings[0]
    assert "pw" not in warnings[0].replace("rtsp://u:***@", "")


def test_config_check_logs_the_same_url_warning_once(tmp_path):
    file = tmp_path / "twice.yaml"
    file.write_text("sources:\n  - {id: front, url: clips/a.mp4}\n  - {id: back, url: clips/a.mp4}\n")
    result = subprocess.run([sys.executable, "-m", "app", "config", "check", str(file)], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "same URL" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "'front'" in lines[0] and "'back'" in lines[0], result.stderr
