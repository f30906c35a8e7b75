"""Where downloads are cached: ``$DETSTREAM_CACHE`` or ``~/.cache/detstream``, resolved at call time.

Resolved per call (never at import) so tests and operators can point one
process at another cache by setting the variable, and nothing touches the
home directory until a fetch actually runs.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """The cache folder, created; ``cache_dir`` wins over ``$DETSTREAM_CACHE`` over ``~/.cache/detstream``."""
    chosen = cache_dir or os.environ.get("DETSTREAM_CACHE") or "~/.cache/detstream"
    root = Path(chosen).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root
