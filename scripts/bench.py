#!/usr/bin/env python
"""``python scripts/bench.py ARGS`` is ``detstream bench ARGS`` (see BENCHMARKS.md and ``--help``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench import bench_command
from app.logs import setup_logging

if __name__ == "__main__":
    setup_logging("INFO", "text")
    sys.exit(bench_command(sys.argv[1:]))
