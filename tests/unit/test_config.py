"""The config contract: every bad config names its field path; defaults, ids, shards, masking, `config check`."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import (
    DetstreamConfig,
    SourceKind,
    SourceMode,
    derive_source_id,
    load_config,
    masked_dump,
    parse_config,
    shard_of,
    source_kind,
)
from app.errors import ConfigError
from app.redact import forget_secrets

REPO = Path(__file__).resolve().parents[2]
ONE_FILE = [{"url": "clips/a.mp4"}]

@pytest.fixture(autouse=True)
def _own_secrets():
    """Secrets registered by one test's config must not mask another test's text."""
    yield
    forget_secrets()



def config_error(tree: object, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(tree, env={} if env is None else env)
    return str(caught.value)


# -- bad configs: the error starts with the offending field path ----------------------------------------------------

BAD_CONFIGS = [
    pytest.param({"sources": ONE_FILE, "bogus": 1}, "bogus", "Extra inputs are not permitted", id="unknown-top-key"),
    pytest.param({"sources": [{"url": "a.mp4", "colour": "red"}]}, "sources[0].colour", "Extra inputs",
                 id="unknown-source-key"),
    pytest.param({"sources": ONE_FILE, "engine": {"max_batch": "eight"}}, "engine.max_batch", "valid integer",
                 id="wrong-type-int"),
    pytest.param({"sources": ONE_FILE, "engine": {"max_batch": -1}}, "engine.max_batch", "greater than or equal to 1",
                 id="negative-max-batch"),
    pytest.param({"sources": ONE_FILE, "engine": {"max_batch": 0}}, "engine.max_batch", "greater than or equal to 1",
                 id="zero-max-batch"),
    pytest.param({"sources": ONE_FILE, "engine": {"backend": "cuda"}}, "engine.backend", "'auto', 'tensorrt'",
                 id="unknown-backend"),
    pytest.param({"sources": ONE_FILE, "engine": {"precision": "fp8"}}, "engine.precision", "'fp32'",
                 id="unknown-precision"),
    pytest.param({"sources": ONE_FILE, "engine": {"ring_slots": 4097}}, "engine.ring_slots",
                 "less than or equal to 4096", id="too-many-ring-slots"),
    pytest.param({"sources": ONE_FILE, "engine": {"tensorrt": {"contexts": 0}}}, "engine.tensorrt.contexts",
                 "greater than or equal to 1", id="zero-tensorrt-contexts"),
    pytest.param({"sources": ONE_FILE, "engine": {"tensorrt": {"streams": 2}}}, "engine.tensorrt.streams",
                 "Extra inputs", id="unknown-tensorrt-key"),
    pytest.param({"sources": ONE_FILE, "engine": {"onnxruntime": {"workers": 17}}}, "engine.onnxruntime.workers",
                 "less than or equal to 16", id="too-many-onnxruntime-workers"),
    pytest.param({"sources": ONE_FILE, "engine": {"onnxruntime": {"intra_op_threads": 257}}},
                 "engine.onnxruntime.intra_op_threads", "less than or equal to 256", id="too-many-intra-op-threads"),
    pytest.param({"sources": ONE_FILE, "engine": {"contexts": 0}}, "engine.tensorrt.contexts",
                 "greater than or equal to 1", id="deprecated-key-checked-at-its-new-path",
                 marks=pytest.mark.filterwarnings("ignore:engine.contexts is deprecated:DeprecationWarning")),
    pytest.param({"sources": [{"url": "a.mp4", "max_fps": "fast"}]}, "sources[0].max_fps", "valid number",
                 id="wrong-type-float"),
    pytest.param({"sources": [{"url": "a.mp4", "max_fps": 0}]}, "sources[0].max_fps", "greater than 0",
                 id="zero-max-fps"),
    pytest.param({"sources": [{"url": 5}]}, "sources[0].url", "valid string", id="url-not-a-string"),
    pytest.param({"sources": [{"id": "bad id", "url": "a.mp4"}]}, "sources[0].id", "should match pattern",
                 id="id-with-space"),
    pytest.param({"sources": [{"id": "x", "url": "a.mp4"}, {"id": "x", "url": "b.mp4"}]}, "sources[1].id",
                 "duplicate id 'x' (also sources[0])", id="duplicate-ids"),
    pytest.param({"sources": [{"url": "rtsp://u:${CAM_PW}@cam/x"}]}, "sources[0].url",
                 "environment variable ${CAM_PW} is not set", id="unset-env-var"),
    pytest.param({"sources": ONE_FILE, "publish": {"endpoint": "tcp://${HOST}:5555"}}, "publish.endpoint",
                 "${HOST} is not set", id="unset-env-var-nested"),
    pytest.param({"sources": [{"url": "rtp://10.0.0.5:5004/x"}]}, "sources[0].url", "unsupported scheme 'rtp'",
                 id="scheme-rtp"),
    pytest.param({"sources": [{"url": "rtsp://user:pw@/stream1"}]}, "sources[0].url", "no host",
                 id="rtsp-without-host"),
    pytest.param({"sources": [{"url": "/dev/sda"}]}, "sources[0].url", "unsupported device", id="not-a-video-device"),
    pytest.param({"sources": [{"url": "a.mp4", "mode": "fast"}]}, "sources[0].mode", "'live' or 'file'",
                 id="unknown-mode"),
    pytest.param({"sources": [{"url": "a.mp4", "reconnect": {"initial_s": 0}}]}, "sources[0].reconnect.initial_s",
                 "greater than 0", id="nested-bound"),
    pytest.param({"sources": ONE_FILE, "publish": {"endpoint": "udp://127.0.0.1:5555"}}, "publish.endpoint",
                 "unsupported endpoint", id="endpoint-udp"),
    pytest.param({"sources": ONE_FILE, "publish": {"endpoint": "127.0.0.1:5555"}}, "publish.endpoint",
                 "unsupported endpoint", id="endpoint-without-scheme"),
    pytest.param({"sources": ONE_FILE, "publish": {"endpoint": "bind+tcp://*:5555"}}, "publish.endpoint",
                 "unsupported endpoint", id="endpoint-unknown-prefix"),
    pytest.param({"sources": ONE_FILE, "publish": {"encoding": "protobuf"}}, "publish.encoding", "'json' or 'msgpack'",
                 id="unknown-encoding"),
    pytest.param({"sources": ONE_FILE, "publish": {"curve": {}}}, "publish.curve.server_secret_file", "Field required",
                 id="missing-nested-field"),
    pytest.param({"sources": ONE_FILE, "metrics": {"port": 70000}}, "metrics.port", "less than or equal to 65535",
                 id="port-too-big"),
    pytest.param({"sources": ONE_FILE, "model": {"conf_threshold": 1.5}}, "model.conf_threshold",
                 "less than or equal to 1", id="threshold-above-one"),
    pytest.param({"sources": ONE_FILE, "model": {"classes": "person"}}, "model.classes", "valid list",
                 id="classes-not-a-list"),
    pytest.param({"sources": ONE_FILE, "model": {"format": "ssd"}}, "model.format",
                 "unknown output layout 'ssd' (registered: yolov5, yolov8, nms)", id="unknown-model-format"),
    pytest.param({"sources": ONE_FILE, "duration_s": -3}, "duration_s", "greater than 0", id="negative-duration"),
    pytest.param({"sources": ONE_FILE, "log": {"format": "xml"}}, "log.format", "'text' or 'json'",
                 id="unknown-log-format"),
    pytest.param({"sources": []}, "sources", "at least 1 item", id="no-sources"),
    pytest.param({"model": {}}, "sources", "Field required", id="sources-missing"),
    pytest.param({"sources": "a.mp4"}, "sources", "valid list", id="sources-not-a-list"),
    pytest.param({"sources": ONE_FILE, "engine": []}, "engine", "valid dictionary", id="section-not-a-mapping"),
    pytest.param(["sources"], "config", "expected a mapping", id="top-level-list"),
]


@pytest.mark.parametrize(("tree", "path", "message"), BAD_CONFIGS)
def test_a_bad_config_names_the_field_path(tree, path, message):
    error = config_error(tree)
    assert error.startswith(f"{path}: "), error
    assert message in error
    assert "\n" not in error


def test_several_problems_are_all_reported_in_one_line():
    error = config_error({"sources": [{"url": "a.mp4", "max_fps": -1}], "engine": {"max_batch": 0}})
    assert "sources[0].max_fps: " in error and "engine.max_batch: " in error and "\n" not in error


def test_an_error_about_a_url_never_shows_its_password():
    error = config_error({"sources": [{"url": "rtsp://admin:s3cret@/x"}]})
    assert "s3cret" not in error and "admin:***@" in error


# -- environment interpolation ------------------------------------------------------------------------------------

def test_env_vars_are_interpolated_anywhere_in_a_string():
    config = parse_config({"sources": [{"id": "gate", "url": "rtsp://${CAM_USER}:${CAM_PASSWORD}@${CAM_HOST}/s1"}],
                           "publish": {"endpoint": "tcp://127.0.0.1:${PORT}"}},
                          env={"CAM_USER": "admin", "CAM_PASSWORD": "hunter2", "CAM_HOST": "10.0.0.5", "PORT": "6000"})
    assert config.sources[0].url == "rtsp://admin:hunter2@10.0.0.5/s1"
    assert config.publish.endpoint == "tcp://127.0.0.1:6000"


def test_an_interpolated_number_is_validated_as_a_number():
    config = parse_config({"sources": ONE_FILE, "engine": {"max_batch": "${BATCH}"}}, env={"BATCH": "4"})
    assert config.engine.max_batch == 4
    assert config_error({"sources": ONE_FILE, "engine": {"max_batch": "${BATCH}"}}, env={"BATCH": "x"}).startswith(
        "engine.max_batch: ")


def test_text_that_only_looks_like_a_variable_is_left_alone():
    config = parse_config({"sources": [{"url": "clips/$HOME-{x}.mp4"}]}, env={})
    assert config.sources[0].url == "clips/$HOME-{x}.mp4"


def test_the_process_environment_is_used_when_no_env_is_given(monkeypatch):
    monkeypatch.setenv("DETSTREAM_TEST_CLIP", "clips/from-env.mp4")
    config = parse_config({"sources": [{"url": "${DETSTREAM_TEST_CLIP}"}]})
    assert config.sources[0].url == "clips/from-env.mp4"


# -- defaults by URL kind -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("source", "kind", "mode"),
    [
        ({"url": "clips/a.mp4"}, SourceKind.FILE, SourceMode.FILE),
        ({"url": "file:///videos/a.mkv"}, SourceKind.FILE, SourceMode.FILE),
        ({"url": "clips/a.mp4", "realtime": True}, SourceKind.FILE, SourceMode.LIVE),
        ({"url": "clips/a.mp4", "mode": "live"}, SourceKind.FILE, SourceMode.LIVE),
        ({"url": "rtsp://10.0.0.5/stream1"}, SourceKind.RTSP, SourceMode.LIVE),
        ({"url": "RTSPS://10.0.0.5/stream1"}, SourceKind.RTSP, SourceMode.LIVE),
        ({"url": "rtsp://10.0.0.5/stream1", "mode": "file"}, SourceKind.RTSP, SourceMode.FILE),
        ({"url": "https://example.com/live.m3u8"}, SourceKind.HTTP, SourceMode.LIVE),
        ({"url": "/dev/video0"}, SourceKind.DEVICE, SourceMode.LIVE),
    ],
)
def test_the_default_mode_follows_the_kind_of_url(source, kind, mode):
    config = parse_config({"sources": [source]}, env={})
    assert config.sources[0].kind is kind is source_kind(source["url"])
    assert config.sources[0].effective_mode is mode


def test_defaults_match_the_contract():
    config = parse_config({"sources": ONE_FILE}, env={})
    assert (config.model.name, config.model.conf_threshold, config.model.iou_threshold) == ("yolov3-tiny", 0.25, 0.45)
    assert (config.engine.backend, config.engine.max_batch, config.engine.max_wait_ms) == ("auto", 8, 10.0)
    assert (config.engine.tensorrt.contexts, config.engine.onnxruntime.workers, config.engine.precision) == (
        2, 2, "auto")
    assert (config.engine.openvino.requests, config.engine.openvino.device) == (2, "CPU")
    assert (config.engine.tensorrt.cuda_graphs, config.engine.onnxruntime.intra_op_threads) == (True, None)
    assert (config.publish.endpoint, config.publish.encoding) == ("tcp://127.0.0.1:5555", "json")
    assert (config.publish.heartbeat_s, config.publish.startup_wait_s) == (5.0, 1.0)
    assert (config.metrics.port, config.metrics.host) == (None, "127.0.0.1")


# -- engine keys of the previous release ----------------------------------------------------------------------------

MOVED = [
    ("contexts", 3, {("tensorrt", "contexts"): 3, ("onnxruntime", "workers"): 3},
     "engine.contexts is deprecated: use engine.tensorrt.contexts and engine.onnxruntime.workers"),
    ("cuda_graphs", False, {("tensorrt", "cuda_graphs"): False},
     "engine.cuda_graphs is deprecated: use engine.tensorrt.cuda_graphs"),
    ("cache_dir", "/data/engines", {("tensorrt", "cache_dir"): "/data/engines"},
     "engine.cache_dir is deprecated: use engine.tensorrt.cache_dir"),
    ("calib", "clips/site.mp4", {("tensorrt", "calib"): "clips/site.mp4"},
     "engine.calib is deprecated: use engine.tensorrt.calib"),
    ("intra_op_threads", 1, {("onnxruntime", "intra_op_threads"): 1},
     "engine.intra_op_threads is deprecated: use engine.onnxruntime.intra_op_threads"),
]


@pytest.mark.parametrize(("key", "value", "mapped", "warning"), MOVED, ids=[m[0] for m in MOVED])
def test_a_flat_engine_key_of_the_previous_release_is_mapped_and_warned_once_naming_the_new_key(
    key, value, mapped, warning, caplog
):
    with pytest.warns(DeprecationWarning) as caught, caplog.at_level("WARNING", logger="app.engine_config"):
        config = parse_config({"sources": ONE_FILE, "engine": {"max_batch": 4, key: value}}, env={})
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [warning]
    unused = ["engine.tensorrt.calib is not used: INT8 engines are built from the Q/DQ model that "
              "`detstream quantize --calib PATH` makes"] if key == "calib" else []
    assert [r.getMessage() for r in caplog.records] == [warning, *unused]
    for (section, name), expected in mapped.items():
        assert getattr(getattr(config.engine, section), name) == expected
    assert config.engine.max_batch == 4


def test_every_flat_engine_key_in_one_file_warns_once_each():
    tree = {"sources": ONE_FILE, "engine": {key: value for key, value, _, _ in MOVED}}
    with pytest.warns(DeprecationWarning) as caught:
        config = parse_config(tree, env={})
    assert sorted(str(w.message) for w in caught) == sorted(warning for *_, warning in MOVED)
    assert (config.engine.tensorrt.contexts, config.engine.onnxruntime.workers) == (3, 3)


def test_a_flat_key_and_its_new_key_together_are_an_error_naming_both():
    with pytest.warns(DeprecationWarning):
        error = config_error({"sources": ONE_FILE, "engine": {"contexts": 3, "onnxruntime": {"workers": 1}}})
    assert error.startswith("engine: engine.contexts: also set as engine.onnxruntime.workers"), error


def test_the_new_sections_load_without_a_warning(recwarn, caplog):
    tree = {"sources": ONE_FILE, "engine": {"tensorrt": {"contexts": 4, "cuda_graphs": False},
                                            "onnxruntime": {"workers": 1, "intra_op_threads": 2}}}
    config = parse_config(tree, env={})
    assert (config.engine.tensorrt.contexts, config.engine.onnxruntime.intra_op_threads) == (4, 2)
    assert config.engine.in_flight == 4
    assert not [w for w in recwarn if w.category is DeprecationWarning] and not caplog.records


def test_a_mapped_config_dumped_and_parsed_again_does_not_warn_again(recwarn):
    """``detstream run`` parses the file, then its dump with the command-line overrides applied."""
    with pytest.warns(DeprecationWarning):
        first = parse_config({"sources": ONE_FILE, "engine": {"contexts": 3}}, env={})
    recwarn.clear()
    again = parse_config(first.model_dump(mode="json", exclude_unset=True), env={})
    assert again.engine == first.engine
    assert not [w for w in recwarn if w.category is DeprecationWarning]


def test_config_check_of_a_file_with_a_flat_engine_key_warns_once_and_shows_the_new_keys(tmp_path):
    file = tmp_path / "old.yaml"
    file.write_text("sources:\n  - url: a.mp4\nengine:\n  contexts: 3\n")
    result = run_config_check(file)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("engine.contexts is deprecated: use engine.tensorrt.contexts") == 1, result.stderr
    engine = yaml.safe_load(result.stdout)["engine"]
    assert (engine["tensorrt"]["contexts"], engine["onnxruntime"]["workers"]) == (3, 3)
    assert "contexts" not in engine


# -- ids and shards -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("videos/gate-cam.mp4", "gate-cam"),
        ("file:///srv/clips/lobby.mkv", "lobby"),
        ("rtsp://admin:pw@10.0.0.5/stream1", "10.0.0.5_stream1"),
        ("rtsp://10.0.0.5:554/", "10.0.0.5"),
        ("https://example.com/live/cam.m3u8", "example.com_live_cam.m3u8"),
        ("/dev/video0", "src_dev_video0"),
        ("%%%.mp4", "source3"),
    ],
)
def test_a_source_without_id_gets_a_readable_one_from_its_url(url, expected):
    assert derive_source_id(url, 3) == expected


def test_derived_ids_never_contain_credentials():
    assert "pw" not in derive_source_id("rtsp://admin:pw@cam.local/live", 0)


def test_derived_ids_are_filled_in_and_checked_for_duplicates():
    config = parse_config({"sources": [{"url": "a/gate.mp4"}, {"url": "rtsp://cam/x"}]}, env={})
    assert [s.id for s in config.sources] == ["gate", "cam_x"]
    assert "duplicate id 'gate'" in config_error({"sources": [{"url": "a/gate.mp4"}, {"url": "b/gate.mp4"}]})


@pytest.mark.parametrize(("source_id", "shards", "expected"),
                         [("gate", 3, 0), ("cam1", 3, 1), ("cam2", 3, 2), ("lobby", 3, 2), ("gate", 1, 0)])
def test_shard_of_is_a_fixed_function_of_the_id(source_id, shards, expected):
    """Pinned values: every worker (any machine, any PYTHONHASHSEED) must agree on them."""
    assert shard_of(source_id, shards) == expected


def test_shard_of_is_the_same_in_another_interpreter():
    code = "from app.config import shard_of; print([shard_of(f'cam{i}', 5) for i in range(50)])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                           cwd=REPO, check=True)
    assert other.stdout.strip() == str([shard_of(f"cam{i}", 5) for i in range(50)])


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_shard_of_spreads_ids_evenly(shards):
    counts = collections.Counter(shard_of(f"camera-{i:04d}", shards) for i in range(1200))
    expected = 1200 / shards
    assert set(counts) == set(range(shards))
    assert all(abs(n - expected) < 0.2 * expected for n in counts.values()), counts


# -- masking ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("password", ["s3cret", "hunter2!", "p%40ss", "a:b:c", "Zm9vYmFy=="])
def test_masked_dump_never_contains_the_password(password):
    config = parse_config({"sources": [{"id": "gate", "url": "rtsp://admin:${PW}@10.0.0.5/s1"},
                                       {"id": "lobby", "url": f"rtsps://viewer:{password}@cam.local:322/live"}]},
                          env={"PW": password})
    dump = masked_dump(config)
    assert password not in dump
    assert "rtsp://admin:***@10.0.0.5/s1" in dump and "rtsps://viewer:***@cam.local:322/live" in dump
    # the dump did not change the config; the interpolated password is percent-encoded, so it always parses
    assert config.sources[0].url == f"rtsp://admin:{quote(password, safe='')}@10.0.0.5/s1"


def test_masked_dump_hides_a_password_with_a_raw_at_sign():
    config = parse_config({"sources": [{"url": "rtsp://admin:p@ssw0rd@10.0.0.5/s1"}]}, env={})
    assert "ssw0rd" not in masked_dump(config)


def test_masked_dump_is_a_valid_config_again():
    config = parse_config({"sources": [{"url": "rtsp://u:pw@cam/x"}, {"url": "clips/a.mp4"}]}, env={})
    again = parse_config(yaml.safe_load(masked_dump(config)), env={})
    assert [s.id for s in again.sources] == [s.id for s in config.sources]


# -- load_config and `detstream config check` ---------------------------------------------------------------------

def test_load_config_reports_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read config"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("sources: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML"):
        load_config(broken)


def run_config_check(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "config", "check", str(path)], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, **env})


def test_config_check_prints_the_resolved_config_masked_and_exits_0(tmp_path):
    file = tmp_path / "cams.yaml"
    file.write_text("sources:\n  - id: gate\n    url: rtsp://admin:${CAM_PASSWORD}@10.0.0.5/stream1\n"
                    "engine:\n  max_batch: 4\n")
    result = run_config_check(file, CAM_PASSWORD="s3cretPW")
    assert result.returncode == 0, result.stderr
    assert "s3cretPW" not in result.stdout + result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["sources"][0]["url"] == "rtsp://admin:***@10.0.0.5/stream1"
    assert resolved["engine"]["max_batch"] == 4 and resolved["engine"]["max_wait_ms"] == 10.0


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("sources:\n  - url: rtp://10.0.0.5/x\n", "sources[0].url"),
        ("sources:\n  - url: a.mp4\nengine:\n  max_batch: -2\n", "engine.max_batch"),
        ("sources:\n  - url: rtsp://u:${NOT_SET_ANYWHERE}@h/x\n", "sources[0].url"),
    ],
)
def test_config_check_of_a_bad_file_is_one_line_naming_the_field(tmp_path, text, field):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    result = run_config_check(file)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{field}: " in lines[0], result.stderr
    assert result.stdout == ""


# -- fuzz: parse_config raises ConfigError or nothing -------------------------------------------------------------

FIELD_NAMES = sorted({"sources", "id", "url", "mode", "max_fps", "realtime", "loop", "reconnect", "initial_s", "model",
                      "name", "path", "classes", "engine", "backend", "max_batch", "publish", "endpoint", "curve",
                      "metrics", "port", "host", "log", "level", "format", *DetstreamConfig.model_fields})
URLISH = st.sampled_from(["a.mp4", "rtsp://u:p@h/x", "rtsp://", "http://[::1", "http://[bad/x", "rtp://h",
                          "/dev/video1", "/dev/x", "file://", "${X}", "${UNSET}", "connect+tcp://h:1", "tcp://", "",
                          "://", "%%"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | URLISH
KEYS = st.sampled_from(FIELD_NAMES) | st.text(max_size=6) | st.integers(-2, 2) | st.none() | st.booleans()
TREES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
                     max_leaves=25)
SOURCE = st.fixed_dictionaries({"url": URLISH | SCALARS},
                                optional={"id": st.sampled_from(["gate", "a", "bad id", ""]) | SCALARS,
                                          "mode": st.sampled_from(["live", "file", "x"]) | SCALARS,
                                          "max_fps": SCALARS, "loop": SCALARS, "reconnect": TREES, "x": SCALARS})
NEAR_VALID = st.fixed_dictionaries({"sources": st.lists(SOURCE, max_size=3)},
                                   optional={key: TREES for key in ("model", "engine", "publish", "metrics", "log")})
MOSTLY_VALID = st.fixed_dictionaries({"sources": st.lists(st.fixed_dictionaries({"url": URLISH}), min_size=1,
                                                              max_size=4)},
                                     optional={"engine": st.fixed_dictionaries({"max_batch": SCALARS})})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES | NEAR_VALID | MOSTLY_VALID)
def test_parse_config_only_ever_raises_config_error(tree):
    try:
        parse_config(tree, env={"X": "rtsp://u:p@h/x"})
    except ConfigError as error:
        assert str(error)
