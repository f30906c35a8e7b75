"""Generated configs against `detstream config check` and a 2-second `detstream run`.

Every outcome is exit 0, or exit 2 with exactly one ``detstream: error:`` line
(short, naming a field), within 10 s, never a traceback. The bulk goes through
``parse_config`` in-process (the same code the CLI runs); a few examples go
through the real CLI, and five through a real run on the vtest clip.
"""

from __future__ import annotations

import math
import time

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.config import DetstreamConfig, masked_dump, parse_config
from app.errors import ConfigError
from app.redact import forget_secrets
from tests.conftest import detstream, free_port

MAX_ERROR_CHARS = 2000
NUMBERS = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**40, 10**40)
           | st.sampled_from([0, 0.1, 1, 60, 86_400, 10**7, 10**30, 1e308, "1e30", ".inf", "nan", True]))
LONG_TEXT = st.integers(0, 100_000).map(lambda n: "x" * n)
TEXT = st.text(max_size=30) | LONG_TEXT | st.sampled_from(["rtsp://u:p/w@h/x", "rtsp://u:${PW}@h/x", "a.mp4"])
VALUES = NUMBERS | TEXT | st.none() | st.booleans() | st.lists(st.integers(), max_size=2)

@pytest.fixture(autouse=True)
def _own_secrets():
    """Secrets registered by one test's config must not mask another test's text."""
    yield
    forget_secrets()


SOURCE_KEYS = ["id", "url", "mode", "max_fps", "transport", "realtime", "loop", "open_timeout_s", "read_timeout_s",
               "stall_timeout_s", "max_staleness_ms", "reconnect"]
BACKOFF_KEYS = ["initial_s", "max_s", "multiplier", "reset_after_s"]
SECTION_KEYS = {"publish": ["endpoint", "encoding", "sndhwm", "linger_ms", "heartbeat_s", "startup_wait_s"],
                "metrics": ["port", "host"], "annotate": ["dir", "snapshots"], "log": ["level", "format"]}
ANY_KEY = st.text(max_size=8) | st.integers(0, 5000).map(lambda n: "k" * n)


def section(keys: list[str]) -> st.SearchStrategy[dict]:
    known = st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys))
    return st.one_of(known, st.dictionaries(ANY_KEY, VALUES, max_size=2), VALUES)


POINTS = st.lists(st.lists(NUMBERS, min_size=2, max_size=3) | VALUES, max_size=5) | VALUES
REGION_KEYS = {"name": st.sampled_from(["a", "b", "a b"]) | TEXT, "points": POINTS, "units": VALUES,
               "classes": VALUES, "anchor": VALUES, "min_frames": VALUES, "min_dwell_s": VALUES, "in_side": VALUES}
REGIONS = st.lists(st.fixed_dictionaries({}, optional=REGION_KEYS), max_size=2) | VALUES
SOURCES = st.lists(st.fixed_dictionaries({"url": st.sampled_from(["clips/a.mp4", "rtsp://u:${PW}@cam/x"]) | TEXT},
                                         optional={k: VALUES for k in SOURCE_KEYS[:1] + SOURCE_KEYS[2:-1]}
                                         | {"reconnect": section(BACKOFF_KEYS), "zones": REGIONS,
                                            "lines": REGIONS}), min_size=0, max_size=3)
CONFIGS = st.fixed_dictionaries({"sources": SOURCES},
                                optional={name: section(keys) for name, keys in SECTION_KEYS.items()}
                                | {"duration_s": VALUES, "k" * 5000: VALUES})


def finite_numbers(config: DetstreamConfig) -> bool:
    def walk(value) -> bool:
        if isinstance(value, dict):
            return all(walk(v) for v in value.values())
        if isinstance(value, list):
            return all(walk(v) for v in value)
        return not isinstance(value, float) or math.isfinite(value)

    return walk(config.model_dump())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tree=CONFIGS)
def test_a_generated_config_is_valid_and_finite_or_one_short_error(tree):
    started = time.perf_counter()
    try:
        config = parse_config(tree, env={"PW": "p@ss:w/rd%"})
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message and "Traceback" not in message
        assert len(message) < MAX_ERROR_CHARS, message[:300]
    else:
        assert finite_numbers(config)
        dump = masked_dump(config)
        assert "p@ss:w/rd%" not in dump and "p%40ss" not in dump
    assert time.perf_counter() - started < 2.0


def one_error_or_nothing(result, started: float, limit_s: float) -> None:
    took = time.monotonic() - started
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert took < limit_s, f"took {took:.1f} s"
    if result.returncode == 0:
        return
    errors = [line for line in result.stderr.splitlines() if line.startswith("detstream: error:")]
    assert result.returncode == 2 and len(errors) == 1, (result.returncode, result.stderr[-2000:])
    assert len(errors[0]) < MAX_ERROR_CHARS


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                HealthCheck.function_scoped_fixture])
@given(tree=CONFIGS)
def test_config_check_of_a_generated_file_exits_0_or_2_with_one_error_line(tree, tmp_path):
    file = tmp_path / "fuzz.yaml"
    file.write_text(yaml.safe_dump(tree))
    started = time.monotonic()
    result = detstream("config", "check", str(file), env={"PW": "p@ss:w/rd%"}, timeout_s=30)
    one_error_or_nothing(result, started, 10.0)


# Runs: values that validate (or nearly) around the edges, on a real clip, bounded to 2 s.
RUN_NUMBERS = st.sampled_from([1, 2.5, 1e-9, 0.05, 59.9, 86_400.0, 1e308, 10**7, -1])
RUN_SOURCE = st.fixed_dictionaries({}, optional={
    "max_fps": RUN_NUMBERS, "realtime": st.booleans(), "loop": st.booleans(), "mode": st.sampled_from(["live", "file"]),
    "open_timeout_s": RUN_NUMBERS, "read_timeout_s": RUN_NUMBERS, "stall_timeout_s": RUN_NUMBERS,
    "max_staleness_ms": RUN_NUMBERS, "reconnect": st.fixed_dictionaries({}, optional={k: RUN_NUMBERS
                                                                                      for k in BACKOFF_KEYS})})
RUN_PUBLISH = st.fixed_dictionaries({}, optional={
    "sndhwm": st.sampled_from([1, 10, 10**7, 10**30]), "linger_ms": st.sampled_from([0, 60_000, 10**30]),
    "heartbeat_s": st.sampled_from([0.1, 86_400.0, math.inf]), "startup_wait_s": st.sampled_from([0, 0.5, 1e308]),
    "encoding": st.sampled_from(["json", "msgpack"])})


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(source=RUN_SOURCE, publish=RUN_PUBLISH)
@example(source={}, publish={})  # at least one run that validates and decodes
@example(source={"realtime": True, "max_fps": 1000, "stall_timeout_s": 0.1, "reconnect": {"max_s": 86_400.0}},
         publish={"sndhwm": 1, "heartbeat_s": 0.1, "linger_ms": 60_000, "startup_wait_s": 0.5})
def test_a_2_second_run_of_a_generated_config_ends_in_10_s_with_0_or_one_error(source, publish, vtest, default_model,
                                                                               tmp_path):
    file = tmp_path / "run.yaml"
    tree = {"sources": [{"id": "clip", "url": str(vtest), **source}],
            "publish": {"endpoint": f"tcp://127.0.0.1:{free_port()}", **publish}}
    file.write_text(yaml.safe_dump(tree))
    started = time.monotonic()
    result = detstream("run", str(file), "--duration", "2", "--no-progress", timeout_s=30)
    one_error_or_nothing(result, started, 10.0)
    if result.returncode == 0:
        assert "clip: published" in result.stderr, result.stderr[-2000:]
