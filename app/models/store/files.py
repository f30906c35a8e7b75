"""File helpers shared by the model and asset fetchers: hashing, atomic writes, scratch folders, clean-up.

Fetches can be interrupted (Ctrl-C, a full disk, two `make demo` at once); a
reader must see either the old complete file or the new complete file, never
half of one, so every output is written beside its target and renamed.

Nothing temporary may outlive the fetch. Temporary files and scratch folders
are removed in ``finally``, and by the forced exit of a second signal, which
skips ``finally`` (:func:`app.stop.at_forced_exit`). What
a SIGKILL or power loss leaves is removed by :func:`sweep_stale` at the next
fetch: only names these helpers make (``.<target>.XXXXXXXX.tmp`` beside a
target, ``<prefix>XXXXXXXX/`` scratch folders), only when older than this
process, and only under the fetch lock, so never another fetch's work in progress.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.stop import at_forced_exit

_CHUNK = 1 << 20
_STARTED = time.time()  # before any temporary file this process makes
_TEMP_SUFFIX = re.compile(r"\.[A-Za-z0-9_]{8}\.tmp")  # mkstemp's eight random characters, then .tmp
_SCRATCH_SUFFIX = re.compile(r"[A-Za-z0-9_]{8}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def scratch_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A new folder ``parent/<prefix>XXXXXXXX`` for the block; removed afterwards, whatever happens."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    forget = at_forced_exit(lambda: _remove(path))
    try:
        yield path
    finally:
        _remove(path)
        forget()


def sweep_stale(scratch: Iterable[tuple[Path, str]] = (), targets: Iterable[Path] = ()) -> list[Path]:
    """Remove what an interrupted fetch left: ``(parent, prefix)`` scratch folders and the temporary files of
    ``targets`` (``.<name>.XXXXXXXX.tmp`` beside each), when older than this process. Returns what it removed.

    Call it holding the fetch lock, so no other process is writing them.
    """
    stale: list[Path] = []
    for parent, prefix in scratch:
        if parent.is_dir():
            stale += [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir()
                      and _SCRATCH_SUFFIX.fullmatch(p.name[len(prefix):])]
    for target in targets:
        if target.parent.is_dir():
            head = f".{target.name}"
            stale += [p for p in target.parent.iterdir() if p.name.startswith(head) and p.is_file()
                      and _TEMP_SUFFIX.fullmatch(p.name[len(head):])]
    removed = []
    for path in stale:
        try:
            if path.lstat().st_mtime < _STARTED:
                _remove(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def atomic_output(target: Path) -> Iterator[Path]:
    """Yield a temporary path in ``target``'s folder; rename it onto ``target`` if the block succeeds.

    On any exception the temporary file is removed and ``target`` is untouched.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    forget = at_forced_exit(lambda: tmp.unlink(missing_ok=True))
    try:
        yield tmp
        tmp.chmod(0o644)  # mkstemp makes 0600; these are shareable artefacts, not secrets
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        forget()


def atomic_write_bytes(target: Path, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically."""
    with atomic_output(target) as tmp:
        tmp.write_bytes(data)
    return target


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``lock_path`` for the block.

    Two processes fetching at once (two test sessions, `make demo` beside
    `make test`) would otherwise both download and convert; with the lock the
    second one waits and then finds the work done.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
