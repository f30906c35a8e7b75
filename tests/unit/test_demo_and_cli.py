"""The built-in demo config, CLI option parsing and overrides."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from app.cli import build_parser
from app.config import parse_config
from app.demo import demo_tree
from app.errors import ConfigError
from app.runner import _overrides, parse_shard, parse_source_arg

ROOT = Path(__file__).resolve().parents[2]


def test_configs_demo_yaml_is_the_built_in_demo():
    from_file = parse_config(yaml.safe_load((ROOT / "configs/demo.yaml").read_text()))
    clip = Path(from_file.sources[0].url)
    assert clip == Path("~/.cache/detstream/clips/vtest.avi").expanduser()
    assert from_file == parse_config(demo_tree(clip))


@pytest.mark.parametrize(("text", "expected"), [
    ("gate=rtsp://u:p@10.0.0.5/s", {"id": "gate", "url": "rtsp://u:p@10.0.0.5/s"}),
    ("rtsp://10.0.0.5/s?a=b", {"url": "rtsp://10.0.0.5/s?a=b"}),
    ("clips/a=b.mp4", {"url": "clips/a=b.mp4"}),
    ("/dev/video0", {"url": "/dev/video0"}),
    ("cam.1=/dev/video2", {"id": "cam.1", "url": "/dev/video2"}),
])
def test_source_arguments_take_an_optional_id(text, expected):
    assert parse_source_arg(text) == expected


@pytest.mark.parametrize("bad", ["", "3/3", "1", "a/b", "-1/2", "0/0"])
def test_bad_shards_are_rejected_with_the_option_named(bad):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(bad)


def test_command_line_options_override_the_config_file():
    args = build_parser().parse_args(["run", "--source", "a.mp4", "--source", "cam=rtsp://h/x", "--publish",
                                      "connect+tcp://127.0.0.1:5556", "--max-batch", "2", "--realtime", "--loop",
                                      "--model", "models/custom.onnx", "--engine", "onnxruntime"])
    tree = _overrides(args, {"sources": [{"url": "old.mp4"}], "engine": {"max_wait_ms": 3}})
    config = parse_config(tree)
    assert [s.id for s in config.sources] == ["a", "cam"]
    assert all(s.realtime and s.loop for s in config.sources)
    assert config.publish.endpoint == "connect+tcp://127.0.0.1:5556"
    assert (config.engine.max_batch, config.engine.max_wait_ms, config.engine.backend) == (2, 3, "onnxruntime")
    assert config.model.path == "models/custom.onnx" and config.model.name is None


def test_every_contract_command_parses():
    parser = build_parser()
    for argv in (["run"], ["run", "c.yaml", "--duration", "5", "--metrics-port", "9108", "--annotate", "out"],
                 ["subscribe", "--stream", "a", "--format", "jsonl", "--count", "3", "--timeout", "2", "--out", "x"],
                 ["models", "fetch"], ["models", "list"], ["build-engine", "m.onnx", "--fp16", "--batch", "1:4:8"],
                 ["build-engine", "m.onnx", "--int8", "--calib", "v.mp4"], ["bench"],
                 ["proxy", "--frontend", "tcp://127.0.0.1:5556", "--backend", "tcp://127.0.0.1:5555"],
                 ["config", "check", "c.yaml"], ["run", "--shard", "0/3"]):
        parser.parse_args(argv)


@pytest.mark.parametrize(("argv", "expected"), [
    (["bench", "--quick"], ["bench", "--", "--quick"]),
    (["--log-level", "DEBUG", "bench", "--quick", "--json", "x"], ["--log-level", "DEBUG", "bench", "--", "--quick",
                                                                 "--json", "x"]),
    (["--log-format", "json", "bench"], ["--log-format", "json", "bench"]),
    (["bench", "--", "--quick"], ["bench", "--", "--quick"]),
    (["run", "--source", "bench"], ["run", "--source", "bench"]),
])
def test_bench_options_reach_the_bench_wherever_the_global_options_stand(argv, expected):
    from app.cli import bench_passthrough

    assert bench_passthrough(argv) == expected


@pytest.mark.parametrize(("batch", "wanted"), [("1:4", "MIN:OPT:MAX, whole numbers"), ("1:x:8", "whole numbers"),
                                               ("4:2:8", "1 <= MIN <= OPT <= MAX"), ("0:1:2", "1 <= MIN")])
def test_build_engine_refuses_a_bad_batch_range_with_its_usage(batch, wanted, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["build-engine", "m.onnx", "--batch", batch])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --batch" in err and wanted in err and "usage: detstream build-engine" in err


def test_build_engine_parses_its_batch_range_and_defaults_it():
    parser = build_parser()
    assert parser.parse_args(["build-engine", "m.onnx", "--batch", "2:4:16"]).batch == (2, 4, 16)
    assert parser.parse_args(["build-engine", "m.onnx"]).batch == (1, 4, 8)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="with TensorRT it would really build")
def test_build_engine_without_a_gpu_or_cache_dir_says_what_it_needs(default_model, capsys):
    """The cache folder defaults to the engines' own; here the command ends on the missing GPU, not a traceback."""
    from app.cli import main

    assert main(["build-engine", str(default_model)]) == 2
    assert "detstream: error: build-engine needs an NVIDIA GPU with TensorRT" in capsys.readouterr().err
