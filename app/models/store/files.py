"""File helpers shared by the model and asset fetchers: hashing and atomic writes.

Fetches can be interrupted (Ctrl-C, a full disk, two `make demo` at once); a
reader must see either the old complete file or the new complete file, never
half of one, so every output is written beside its target and renamed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CHUNK = 1 << 20


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
    try:
        yield tmp
        tmp.chmod(0o644)  # mkstemp makes 0600; these are shareable artefacts, not secrets
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


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
