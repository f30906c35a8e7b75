"""Tables and JSON: the targets of the performance issue checked against a result tree, printed with rich.

Every figure is printed as ``median (min–max)`` over the repeats. A target
whose figure was not measured in this run (``--only``, ``--quick``) says so
instead of passing or failing.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from app.bench.late_seconds import late_text

TARGET_CAMERAS = 8
TARGET_P99_MS = 150.0


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def spread(entry: dict[str, Any] | None, unit: str = "") -> str:
    if not entry or entry.get("median") is None:
        return "-"
    if entry["min"] == entry["max"]:
        return f"{entry['median']:g}{unit}"
    return f"{entry['median']:g}{unit} ({entry['min']:g}–{entry['max']:g})"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{"name", "value", "target", "pass"}]``; ``pass`` is None when the figure was not measured."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Any, target: str, ok: bool | None) -> None:
        rows.append({"name": name, "value": value, "target": target, "pass": ok})

    for label, ratio in results.get("ratios", {}).items():
        for key, name, wanted in (("e2e_over_model_only", f"model-only at batch {ratio.get('model_only_batch')}", 0.95),
                                  ("e2e_over_naive", "naive", 1.15)):
            value = ratio.get(key, {}).get("median")
            add(f"file e2e / {name} ({label})", value, f">= {wanted:g}", None if value is None else value >= wanted)
    live = results.get("live", {})
    step = next((s for s in live.get("steps", []) if s["k"] == TARGET_CAMERAS), None)
    if step is None:
        add(f"live {TARGET_CAMERAS} cameras: no drops, p99", None, f"0 drops, <= {TARGET_P99_MS:g} ms", None)
    else:
        p99 = step["p99_ms"]["median"]
        add(f"live {TARGET_CAMERAS} cameras: drops", step["drops_total"]["median"], "0", step["no_drops"])
        add(f"live {TARGET_CAMERAS} cameras: p99 ms", p99, f"<= {TARGET_P99_MS:g}",
            None if p99 is None else p99 <= TARGET_P99_MS)
    overload = live.get("overload")
    if overload:
        add(f"overload K={overload['k']}: p99 ms", overload["p99_ms"]["median"],
            f"<= {overload['p99_bound_ms']:g}", overload["p99_bounded"])
        per = overload.get("drops_per_camera", {})
        add(f"overload K={overload['k']}: drops/camera min–max", f"{per.get('min')}–{per.get('max')}",
            "spread <= 25% of mean", overload["fair"])
    memory = results.get("memory")
    if memory:
        high = memory["peak_rss_mb_high"]["median"]
        measured = memory["high_k"] == TARGET_CAMERAS
        add(f"peak RSS, {memory['high_k']} streams (MB)", high, "<= 400 (8 streams)",
            high <= 400 if measured else None)
        # per stream from the running peaks: the start-up transient (model load) is caught at K=1 in some runs
        # and not others, and would make streams look cheaper than they are
        per_stream = memory.get("steady_rss_per_stream_mb", memory["rss_per_stream_mb"])
        add("RSS per extra stream, running (MB)", per_stream, "<= 25", per_stream <= 25 if measured else None)
        if "worst_rss_mb_high" in memory:  # results written before the bound existed lack it
            worst = memory["worst_rss_mb_high"]
            add(f"… with the whole ring resident, {memory['high_k']} streams (MB)", worst, "<= 400 (8 streams)",
                worst <= 400 if measured else None)
            add("… per extra stream (MB)", memory["worst_rss_per_stream_mb"], "<= 25",
                memory["worst_rss_per_stream_mb"] <= 25 if measured else None)
    int8 = results.get("int8")
    if int8:
        speedup = int8.get("speedup_model_only")
        add("INT8 / fp32 model-only", speedup, ">= 1.6", None if speedup is None else speedup >= 1.6)
        by_clip = int8.get("agreement_by_clip")
        if by_clip:  # calibrated on each clip's own footage, as the method says
            for label, entry in by_clip.items():
                f1 = entry["own_calibration"].get("f1")
                add(f"INT8 F1 vs fp32, {label} (calibrated on its own footage)", f1, ">= 0.95",
                    None if f1 is None else f1 >= 0.95)
        else:  # results written before per-clip agreement existed
            f1 = int8.get("f1")
            add("INT8 F1 vs fp32", f1, ">= 0.95", None if f1 is None else f1 >= 0.95)
    return rows


def write_json(results: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, allow_nan=False, default=_plain))
    return path


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def print_report(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 132)
    _machine(console, results)
    _throughput(console, results)
    _stages(console, results)
    _live(console, results)
    _memory(console, results)
    _targets(console, results)
    for section, error in results.get("errors", {}).items():
        console.print(f"[red]{section} failed:[/red] {error}")


def _machine(console: Console, results: dict[str, Any]) -> None:
    m = results["machine"]
    model = results.get("model", {})
    table = Table(title="machine", show_header=False)
    table.add_row("cpu", f"{m['cpu']} ({', '.join(m['cpu_flags'])})")
    table.add_row("cores", f"{m['physical_cores']} physical, {m['logical_cpus']} logical; {m['memory_gb']} GiB")
    table.add_row("onnxruntime", f"{m['onnxruntime']}; providers {', '.join(m['providers'])}")
    table.add_row("engine", str(results.get("model_only", {}).get("engine", "-")))
    table.add_row("model", f"{model.get('name', '-')} {model.get('input', '')} {model.get('layout', '')}")
    if m.get("sgemm_gflops_one_thread"):
        table.add_row("fp32 peak, one core", f"{m['sgemm_gflops_one_thread']} GFLOP/s (numpy 2048³ SGEMM, one thread)")
    table.add_row("load avg at start", " ".join(str(x) for x in m["load_avg_at_start"]))
    table.add_row("commit", m["commit"])
    table.add_row("other processes during runs", background_summary(results))
    console.print(table)


def background_summary(results: dict[str, Any]) -> str:
    """How busy the machine was with other work while we measured (cores, median of runs, max)."""
    values = []
    for entry in [*_model_only_entries(results), *results.get("naive", {}).values(), *results.get("file", {}).values(),
                  *results.get("live", {}).get("steps", []), results.get("live", {}).get("overload") or {}]:
        runs = (entry.get("background_cores") or {}).get("runs") or []
        values.extend(runs)
    if not values:
        return "-"
    values.sort()
    return (f"{values[len(values) // 2]:g} cores median, {values[-1]:g} max over {len(values)} runs "
            "(0 on a quiet machine)")


def _model_only_entries(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The model-only summaries, one per clip (results before per-clip model-only had one, under ``model_only``)."""
    by_clip = results.get("model_only_by_clip")
    if by_clip:
        return list(by_clip.values())
    return [results["model_only"]] if results.get("model_only") else []


def throughput_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(benchmark, clip, fps, ms / batch, notes) for every throughput figure; the console and Markdown tables."""
    rows = []
    for model_only in _model_only_entries(results):
        built = model_only.get("pipeline_batch_sizes") or []
        shape = "x".join(str(d) for d in model_only.get("input_hw", [])) or "?"
        for b, entry in model_only["batches"].items():
            note = "" if not built or int(b) in built else "; the pipeline does not build this size"
            rows.append((f"model-only, batch {b}", f"{model_only['clip']} ({shape})", spread(entry["fps"]),
                         spread(entry["ms_per_batch"]),
                         f"CPU {entry['cpu_ms_per_frame']['median']} ms/frame"
                         f"{_arithmetic_note(entry, results['machine'].get('sgemm_gflops_one_thread'))}{note}"))
    for label, entry in results.get("naive", {}).items():
        rows.append(("naive loop", label, spread(entry["fps"]), "", f"{entry['frames']} frames"))
    for label, entry in results.get("file", {}).items():
        notes = (f"wall {spread(entry['wall_s'], ' s')} incl. start-up; mean batch {entry['mean_batch']}; "
                 f"CPU {entry['cpu_ms_per_frame']['median']} ms/frame")
        rows.append(("detstream file mode", label, spread(entry["fps"]), "",
                     notes + ("; lossless" if entry["lossless"] else "; NOT LOSSLESS")))
    int8 = results.get("int8", {})
    int8_clip = int8.get("clip", "")
    if int8.get("input_hw"):  # as the fp32 model-only rows name theirs
        int8_clip += " ({}x{})".format(*int8["input_hw"])
    for b, entry in int8.get("model_only", {}).get("batches", {}).items():
        rows.append((f"INT8 model-only, batch {b}", int8_clip, spread(entry["fps"]), spread(entry["ms_per_batch"]), ""))
    for label, entry in int8.get("file", {}).items():
        rows.append(("INT8 file mode", label, spread(entry["fps"]), "",
                     f"{entry.get('speedup_vs_fp32', '-')}x fp32 file mode"))
    if int8:
        rows.append(("INT8 speedup, model-only", int8_clip, spread(int8.get("speedup_model_only_runs")),
                     "", f"paired with fp32 per round; F1 vs fp32 {int8.get('f1', '-')} ({int8.get('method', '')})"))
    for label, entry in int8.get("agreement_by_clip", {}).items():
        own, bench = entry["own_calibration"], entry["bench_model"]
        note = (f"calibrated on {own['calibrated_on']}: P {_fraction(own.get('precision'))}, "
                f"R {_fraction(own.get('recall'))}, {own.get('frames', '-')} held-out frames, "
                f"{own.get('reference_detections', '-')} fp32 detections")
        if bench.get("calibrated_on") != own.get("calibrated_on"):
            note += f"; the bench's model, calibrated on {bench['calibrated_on']}: F1 {_fraction(bench.get('f1'))}"
        rows.append(("INT8 F1 against fp32", label, _fraction(own.get("f1")), "", note))
    for label, ratio in results.get("ratios", {}).items():
        used, best = ratio.get("model_only_batch"), ratio.get("model_only_best_batch")
        for key, what in (("e2e_over_model_only", f"model-only at the pipeline's batch ({used})"),
                          ("e2e_over_model_only_best", f"model-only at its best batch ({best})"),
                          ("e2e_over_naive", "the naive loop")):
            if key in ratio:
                rows.append((f"ratio e2e / {what}", label, spread(ratio[key]),
                             "", f"paired per repeat; ratio of medians {ratio[key + '_of_medians']}"))
    return rows


def _arithmetic_note(entry: dict[str, Any], sgemm: float | None) -> str:
    """``; 104 GFLOP/s per core (1.01 of SGEMM)``: how close model-only computes to the core's fp32 peak."""
    rate = entry.get("gflops_per_core")
    if not rate:
        return ""
    return f"; {rate} GFLOP/s per core" + (f" ({rate / sgemm:.2f} of SGEMM)" if sgemm else "")


def _throughput(console: Console, results: dict[str, Any]) -> None:
    table = Table(title="throughput (fps: median (min–max) of repeats)")
    for column in ("benchmark", "clip", "fps", "ms / batch", "notes"):
        table.add_column(column)
    for row in throughput_rows(results):
        table.add_row(*row)
    console.print(table)


def _stages(console: Console, results: dict[str, Any]) -> None:
    table = Table(title="file mode: per-stage latency from the messages (ms)")
    table.add_column("clip")
    for stage in ("decode", "queue", "infer", "post", "total"):
        table.add_column(f"{stage} p50 / p95")
    for label, entry in results.get("file", {}).items():
        stages = entry["stages_ms"]
        table.add_row(label, *(f"{stages[s].get('p50', '-')} / {stages[s].get('p95', '-')}"
                                for s in ("decode", "queue", "infer", "post", "total")))
    post = results.get("model_only", {}).get("postprocess")
    if table.row_count:
        console.print(table)
    if post:
        console.print(f"postprocess of a batch of {post['batch']} real frames: {spread(post['real_ms'], ' ms')} "
                      f"({post['real_detections_per_frame']} detections/frame) vs inference of that batch "
                      f"{post['infer_ms_same_batch']} ms; synthetic crowded batch "
                      f"({post.get('synthetic_candidates_per_frame')} candidates/frame): "
                      f"{post.get('synthetic_crowded_ms')} ms")


def _live(console: Console, results: dict[str, Any]) -> None:
    live = results.get("live")
    if not live:
        return
    table = Table(title=f"live mode: K cameras × {live['fps_per_camera']:g} fps ({live['phase']} phases), "
                        f"{live['duration_s']:g} s per run")
    for column in ("K", "demand fps", "published fps", "p50 ms", "p95 ms", "p99 ms", "drops", "per camera",
                   "peak RSS MB"):
        table.add_column(column)
    steps = list(live["steps"])
    if live.get("overload"):
        steps.append(live["overload"])
    for step in steps:
        k = f"{step['k']}" + (" (overload)" if step is live.get("overload") else "")
        table.add_row(k, f"{step['demand_fps']:g}", spread(step["published_fps"]), spread(step["p50_ms"]),
                      spread(step["p95_ms"]), spread(step["p99_ms"]), spread(step["drops_total"]),
                      f"{step['drops_per_camera_min']}–{step['drops_per_camera_max']}", spread(step["peak_rss_mb"]))
    console.print(table)
    console.print(f"largest K with no drops: {largest_k_text(live)}")
    for line in windows_lines(live):
        console.print(line)


def largest_k_text(live: dict[str, Any]) -> str:
    """The largest K without drops, or which K were measured when every one dropped (not a bare 0)."""
    if live["max_k_no_drops"]:
        return str(live["max_k_no_drops"])
    return "none of K = " + ", ".join(str(step["k"]) for step in live["steps"])


def windows_lines(live: dict[str, Any]) -> list[str]:
    """One line per long run: is it steady minute by minute (p99, drops, RSS, inference time)?"""
    lines = []
    for step in live["steps"]:
        for run in step.get("runs", []):
            windows = run.get("windows") or []
            if not windows:
                continue
            p99 = [w["p99_ms"] for w in windows]
            rss = [w["rss_mb"] for w in windows if w["rss_mb"] is not None]
            worst = windows[p99.index(max(p99))]
            per_minute = ", ".join(f"{v:g}" for v in p99)
            infer = ", ".join(f"{w['infer_p50_ms']:g}" for w in windows)
            cpu = [w.get("cpu_ms_per_frame") for w in windows]
            cpu_text = ("; worker CPU ms per frame per minute: " + ", ".join(f"{c:g}" for c in cpu)
                        if all(c is not None for c in cpu) else "")
            lines.append(f"K={step['k']}, minute by minute ({len(windows)} minutes): p99 {min(p99):g}–{max(p99):g} ms "
                         f"(worst from {worst['start_s']} s), drops per minute at most "
                         f"{max(w['drops'] for w in windows)}, RSS {rss[0] if rss else '-'} MB in the first minute, "
                         f"{rss[-1] if rss else '-'} MB in the last; p99 per minute: {per_minute}; "
                         f"median infer (submit to result, waits included) per minute: {infer}{cpu_text}")
            if run.get("seconds"):
                lines.append(late_text(step["k"], run["seconds"]))
    return lines


def _memory(console: Console, results: dict[str, Any]) -> None:
    memory = results.get("memory")
    if not memory:
        return
    console.print(f"peak RSS of the worker tree: K={memory['low_k']}: {spread(memory['peak_rss_mb_low'], ' MB')}, "
                  f"K={memory['high_k']}: {spread(memory['peak_rss_mb_high'], ' MB')}; "
                  f"{memory['rss_per_stream_mb']} MB per extra stream. Once running (start-up transient left out): "
                  f"K={memory['low_k']}: {spread(memory['steady_peak_rss_mb_low'], ' MB')}, "
                  f"K={memory['high_k']}: {spread(memory['steady_peak_rss_mb_high'], ' MB')}; "
                  f"kernel high-water mark K={memory['high_k']}: {spread(memory['hwm_mb_high'], ' MB')}")
    if "worst_rss_mb_high" in memory:
        console.print(_ring_text(memory))


def _ring_text(memory: dict[str, Any]) -> str:
    """The bound a backlog can reach: every slot of the frame ring written, hence resident."""
    return (f"With the whole frame ring resident (a backlog writes every slot; ring {memory['ring_mb_low']} MB at "
            f"K={memory['low_k']}, {memory['ring_mb_high']} MB at K={memory['high_k']}): at most "
            f"{memory['worst_rss_mb_low']} MB and {memory['worst_rss_mb_high']} MB, "
            f"{memory['worst_rss_per_stream_mb']} MB per extra stream.")


def _targets(console: Console, results: dict[str, Any]) -> None:
    table = Table(title="targets (the performance issue)")
    for column in ("target", "value", "wanted", "result"):
        table.add_column(column)
    for row in results.get("targets", []):
        verdict = {True: "[green]pass[/green]", False: "[red]FAIL[/red]", None: "not measured"}[row["pass"]]
        value = row["value"]
        shown = "-" if value is None else (f"{value:g}" if isinstance(value, float) and math.isfinite(value)
                                           else str(value))
        table.add_row(row["name"], shown, row["target"], verdict)
    console.print(table)


def markdown(results: dict[str, Any]) -> str:
    """The result tree as the Markdown tables of BENCHMARKS.md ("Latest results")."""
    m = results["machine"]
    lines = [f"Machine: {m['cpu']} ({', '.join(m['cpu_flags'])}), {m['physical_cores']} physical cores / "
             f"{m['logical_cpus']} logical, {m['memory_gb']} GiB; {m['os']}; Python {m['python']}; "
             f"onnxruntime {m['onnxruntime']} ({', '.join(m['providers'])}); commit {m['commit']}. "
             + (f"fp32 peak of one core (numpy 2048³ SGEMM, one thread): {m['sgemm_gflops_one_thread']} GFLOP/s. "
                if m.get("sgemm_gflops_one_thread") else "")
             + f"Other processes during the runs: {background_summary(results)}.", ""]
    lines += ["| benchmark | clip | fps, median (min–max) | ms / batch | notes |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in throughput_rows(results)]
    lines += _markdown_stages(results) + _markdown_live(results) + _markdown_memory(results)
    lines += ["", "| target | value | wanted | result |", "| --- | --- | --- | --- |"]
    for row in results.get("targets", []):
        verdict = {True: "pass", False: "**FAIL**", None: "not measured"}[row["pass"]]
        lines.append(f"| {row['name']} | {row['value'] if row['value'] is not None else '-'} | {row['target']} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def _markdown_stages(results: dict[str, Any]) -> list[str]:
    stages = ("decode", "queue", "infer", "post", "total")
    lines = ["", "Per-stage latency of file mode, from the messages' `latency_ms` (ms, p50 / p95):", "",
             "| clip | " + " | ".join(stages) + " |", "| --- |" + " --- |" * len(stages)]
    for label, entry in results.get("file", {}).items():
        cells = [f"{entry['stages_ms'][s].get('p50', '-')} / {entry['stages_ms'][s].get('p95', '-')}" for s in stages]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    post = results.get("model_only", {}).get("postprocess")
    if post:
        lines += ["", f"Postprocess (decode + NMS + rescale) of a batch of {post['batch']} real frames: "
                      f"{post['real_ms']['median']} ms ({post['real_detections_per_frame']} detections/frame), "
                      f"against {post['infer_ms_same_batch']} ms of inference for that batch; a synthetic crowded "
                      f"batch ({post.get('synthetic_candidates_per_frame')} candidates/frame): "
                      f"{post.get('synthetic_crowded_ms')} ms."]
    return lines


def _markdown_live(results: dict[str, Any]) -> list[str]:
    live = results.get("live")
    if not live:
        return []
    lines = ["", f"Live mode: K cameras × {live['fps_per_camera']:g} fps ({live['phase']} phases), "
                 f"{live['duration_s']:g} s per run, latency = `published_at − captured_at`:", "",
             "| K | demand fps | published fps | p50 ms | p95 ms | p99 ms | drops | per camera | peak RSS MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    steps = list(live["steps"]) + ([live["overload"]] if live.get("overload") else [])
    for step in steps:
        k = f"{step['k']}" + (" (overload)" if step is live.get("overload") else "")
        lines.append(f"| {k} | {step['demand_fps']:g} | {spread(step['published_fps'])} | {spread(step['p50_ms'])} | "
                     f"{spread(step['p95_ms'])} | {spread(step['p99_ms'])} | {spread(step['drops_total'])} | "
                     f"{step['drops_per_camera_min']}–{step['drops_per_camera_max']} | {spread(step['peak_rss_mb'])} |")
    lines += ["", f"Largest K with no drops: **{largest_k_text(live)}**."]
    lines += [f"{line}." for line in windows_lines(live)]
    overload = live.get("overload")
    if overload:
        terms = overload["p99_bound_terms_ms"]
        lines.append(f"Overload (K={overload['k']}, capacity {overload['capacity_fps']} fps from "
                     f"{overload.get('capacity_basis', '?')}): p99 {overload['p99_ms']['median']} ms against a "
                     f"bound of {overload['p99_bound_ms']} ms ({terms}); "
                     f"drops per camera {overload['drops_per_camera']}.")
    return lines


def _markdown_memory(results: dict[str, Any]) -> list[str]:
    memory = results.get("memory")
    if not memory:
        return []
    return ["", f"Memory (worker process tree): peak RSS "
                f"K={memory['low_k']} {spread(memory['peak_rss_mb_low'], ' MB')}, "
                f"K={memory['high_k']} {spread(memory['peak_rss_mb_high'], ' MB')}, "
                f"{memory['rss_per_stream_mb']} MB per extra stream; once running (start-up left out) "
                f"K={memory['low_k']} {spread(memory['steady_peak_rss_mb_low'], ' MB')}, "
                f"K={memory['high_k']} {spread(memory['steady_peak_rss_mb_high'], ' MB')} "
                f"({memory['steady_rss_per_stream_mb']} MB per extra stream)."
                + (" " + _ring_text(memory) if "worst_rss_mb_high" in memory else "")]
