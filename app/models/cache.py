"""Where downloads are cached: ``$DETSTREAM_CACHE`` or ``~/.cache/detstream``, resolved at call time."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """The cache folder (created); outside the work tree so repeated set-ups are fast."""
    root = Path(cache_dir) if cache_dir else Path(os.environ.get("DETSTREAM_CACHE", "~/.cache/detstream"))
    root = root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
