"""``detstream models fetch|list``; ``list`` also says when the INT8 model no longer matches the default one, and
what footage it was calibrated on."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Column, Table


def models_command(args: argparse.Namespace) -> int:
    from app.models.store.registry import ensure_default_model, list_models, stale_reason

    if args.models_command == "fetch":
        path = ensure_default_model(args.models_dir, None)
        print(f"default model: {path}")
        stale = stale_reason("yolov3-tiny-int8", args.models_dir)
        if stale:
            print(f"note: the INT8 model is stale: {stale}")
        if args.clips:
            from app.assets import fetch_clip

            for clip in ("vtest.avi", "bikes.mp4"):
                print(f"clip: {fetch_clip(clip, None)}")
        return 0
    from app.models.store.provenance import calibration_of

    # long words (names, paths, metadata keys) fold over lines rather than end in "…": an operator copies them
    table = Table(*(Column(title, overflow="fold") for title in ("name", "present", "path", "size", "note")))
    for entry in list_models(args.models_dir):
        reason = stale_reason(entry.name, args.models_dir) if entry.present else None
        notes = [f"stale: {reason}"] if reason else []
        calibration = calibration_of(entry.path) if entry.present else None
        if calibration:  # INT8 agreement depends on it: calibrated on other footage, bikes lost 0.06 of F1
            notes.append(f"calibrated on {calibration[0]} ({calibration[1]} frames)")
        table.add_row(entry.name, "yes" if entry.present else "no", str(entry.path),
                      f"{entry.size / 1e6:.1f} MB" if entry.present else "-", "; ".join(notes))
    Console().print(table)
    return 0
