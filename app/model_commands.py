"""``detstream models fetch|list``."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


def models_command(args: argparse.Namespace) -> int:
    from app.models.registry import ensure_default_model, list_models

    if args.models_command == "fetch":
        path = ensure_default_model(args.models_dir, None)
        print(f"default model: {path}")
        if args.clips:
            from app.assets import fetch_clip

            for clip in ("vtest.avi", "bikes.mp4"):
                print(f"clip: {fetch_clip(clip, None)}")
        return 0
    table = Table("name", "present", "path", "size")
    for entry in list_models(args.models_dir):
        name, path, present, size = entry
        table.add_row(name, "yes" if present else "no", str(path), f"{size / 1e6:.1f} MB" if present else "-")
    Console().print(table)
    return 0
