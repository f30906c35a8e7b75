"""The bench's one table and its JSON file.

Every repeated figure is printed as ``median (min–max)`` over the repeats.
Below the table, one line per precision answers the sizing question: how many
cameras of this frame rate the machine carries with no drops and the p99
within the bound.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from app.bench.results import BenchResult, Spread

COLUMNS = ("benchmark", "clip", "precision", "fps", "p50 ms", "p99 ms", "drops", "RSS MB", "notes")


def spread(value: Spread | None) -> str:
    if value is None or value.median is None:
        return "-"
    if value.min == value.max:
        return f"{value.median:g}"
    return f"{value.median:g} ({value.min:g}–{value.max:g})"


def rows(result: BenchResult) -> list[tuple[str, ...]]:
    """The table's rows, one per measurement, in :data:`COLUMNS` order."""
    out: list[tuple[str, ...]] = []
    for m in result.model_only:
        out.append((f"model-only, batch {m.best_batch}", f"{m.clip} ({m.input_hw[1]}x{m.input_hw[0]})", m.precision,
                    spread(m.best_fps), "", "", "", "", m.engine))
    for n in result.naive:
        out.append(("naive loop", n.clip, "fp32", spread(n.fps), "", "", "", "", n.providers[0]))
    for f in result.file:
        notes = [f"{f.of_model_only:g}x model-only" if f.of_model_only else "",
                 f"{f.of_naive:g}x naive" if f.of_naive else "", "" if f.lossless else "NOT LOSSLESS"]
        out.append(("file mode", f.clip, f.precision, spread(f.fps), spread(f.p50_ms), spread(f.p99_ms),
                    "0" if f.lossless else "-", spread(f.peak_rss_mb), ", ".join(n for n in notes if n)))
    for live in result.live:
        for step in live.steps:
            verdict = "pass" if step.passed else f"fail (drops, or p99 over {live.p99_bound_ms:g} ms)"
            out.append((f"live, {step.k} x {live.fps_per_camera:g} fps", live.clip, live.precision,
                        spread(step.published_fps), spread(step.p50_ms), spread(step.p99_ms), spread(step.drops),
                        spread(step.running_rss_mb), verdict))
    for mem in result.memory:
        per_camera = f"{mem.rss_per_camera_mb:+g} MB per camera" if mem.rss_per_camera_mb is not None else ""
        out.append((f"memory, {mem.low_k} → {mem.high_k} cameras", "", mem.precision, "", "", "", "",
                    f"{spread(mem.running_rss_mb_low)} → {spread(mem.running_rss_mb_high)}",
                    f"{per_camera}; peak with start-up {spread(mem.peak_rss_mb_high)}"))
    return out


def capacity_lines(result: BenchResult) -> list[str]:
    return [f"capacity ({live.precision}, {live.engine}): {live.max_cameras} cameras of {live.fps_per_camera:g} fps "
            f"with 0 drops and p99 <= {live.p99_bound_ms:g} ms (searched K = "
            f"{', '.join(str(s.k) for s in live.steps)}, {live.duration_s:g} s each)" for live in result.live]


def print_report(result: BenchResult, console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    m = result.machine
    table = Table(title=f"detstream bench: {m.cpu}, {m.logical_cpus} CPUs, {m.memory_gb} GiB; "
                        f"onnxruntime {m.onnxruntime}; openvino {m.openvino or 'not installed'}; commit {m.commit}")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows(result):
        table.add_row(*row)
    console.print(table)
    for line in capacity_lines(result):
        console.print(line)
    for section, error in result.errors.items():
        console.print(f"[red]{section} failed:[/red] {error}")


def write_json(result: BenchResult, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.model_dump_json(indent=1))
    return path
