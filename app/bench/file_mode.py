"""Benchmark 3, detstream in file mode: ``detstream run --source CLIP`` end to end, decode → publish.

The worker is a subprocess; a plain SUB socket in this process counts its
messages. Throughput is measured where a user sees it, at the subscriber,
from the first detection message to the last: batches arrive in bursts, so
the first burst opens the clock and is not counted
(``fps = (n - first_burst) / (t_last - t_first)``). Wall time from process
start to exit (imports, model load, warm-up, drain) is reported separately.

The per-stage breakdown is the messages' own ``latency_ms`` (decode, queue,
infer, post, total). In file mode the decoder is throttled by backpressure, so
``queue`` is mostly frames waiting for the engine, by design.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from app.bench.common import WorkerRun, free_port, percentiles, run_worker, stat
from app.bench.workers import base_tree, write_config

STAGES = ("decode", "queue", "infer", "post", "total")
BURST_GAP_S = 0.004
"""Messages closer than this to the previous one belong to the same burst (one batch's results)."""


def file_args(clip: Path, label: str, model_path: Path, backend: str, endpoint: str,
              overrides: dict[str, Any], work_dir: Path) -> list[str]:
    """The ``detstream run`` arguments: the plain command line, plus a config file only for ``--set`` overrides."""
    args = ["--source", f"{label}={clip}", "--publish", endpoint, "--no-progress", "--model", str(model_path),
            "--engine", backend]
    if overrides:
        tree = base_tree(model_path, backend, endpoint, overrides, [{"id": label, "url": str(clip)}])
        args.insert(0, str(write_config(tree, work_dir / f"file-{label}.yaml")))
    return args


def first_burst(times: list[float]) -> int:
    """How many messages arrived together with the first one."""
    count = 1
    while count < len(times) and times[count] - times[count - 1] < BURST_GAP_S:
        count += 1
    return count


def batch_sizes(dets: list[dict[str, Any]]) -> list[int]:
    """Batch sizes as published: the frames of one engine call share ``latency_ms.infer`` and go out together."""
    sizes: list[int] = []
    previous = None
    for payload in dets:
        same = (previous is not None and payload["latency_ms"]["infer"] == previous["latency_ms"]["infer"]
                and payload["published_at"] - previous["published_at"] < 0.01)
        if same:
            sizes[-1] += 1
        else:
            sizes.append(1)
        previous = payload
    return sizes


def _steady_cpu_ms(run: WorkerRun, times: list[float], burst: int) -> float:
    """Worker CPU per frame between the first and the last message (start-up and drain left out)."""
    cpu = run.cpu_between(times[0], times[-1])
    frames = len(times) - burst
    return cpu * 1e3 / frames if cpu is not None and frames > 0 else run.worker_cpu_s * 1e3 / len(times)


def analyse_file_run(run: WorkerRun) -> dict[str, Any]:
    run.check()
    dets = run.detections()
    if len(dets) < 2:
        raise RuntimeError(f"file mode: only {len(dets)} detection messages received\n{run.stderr_tail}")
    payloads = [p for p, _ in dets]
    times = [t for _, t in dets]
    burst = first_burst(times)
    span = times[-1] - times[0]
    fps = (len(dets) - burst) / span if span > 0 and len(dets) > burst else len(dets) / max(span, 1e-9)
    seqs = sorted(p["seq"] for p in payloads)
    final = [s for s in run.statuses() if s["state"] in ("ended", "failed")]
    sizes = batch_sizes(payloads)
    return {
        "fps": fps,
        "wall_s": run.wall_s,
        "startup_s": times[0] - run.t_start,
        "messages": len(dets),
        "lossless": seqs == list(range(len(seqs))),
        "final_status": final[-1]["state"] if final else None,
        "dropped": final[-1]["dropped"] if final else None,
        "engine": payloads[0].get("engine"),
        "peak_rss_mb": run.peak_rss_mb,
        "steady_peak_rss_mb": run.steady_peak_rss_mb(),
        "background_cores": run.background_cores,
        "cpu_ms_per_frame": _steady_cpu_ms(run, times, burst),
        "mean_batch": float(np.mean(sizes)),
        "stages": {k: [p["latency_ms"][k] for p in payloads] for k in STAGES},
    }


def run_file_once(clip: Path, label: str, model_path: Path, backend: str, overrides: dict[str, Any],
                  timeout_s: float, settle_s: float = 0.0) -> dict[str, Any]:
    """One worker run on ``clip``, analysed (see :func:`analyse_file_run`)."""
    with tempfile.TemporaryDirectory(prefix="detstream-bench-") as tmp:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        args = file_args(clip, label, model_path, backend, endpoint, overrides, Path(tmp))
        run = run_worker(args, endpoint, timeout_s, overrides.get("publish.encoding", "json"), settle_s)
        result = analyse_file_run(run)
    result["command"] = "detstream run " + " ".join(args)
    return result


def summarize_file(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread over the runs; stage latencies pooled over every message of every run."""
    pooled = {k: [v for r in runs for v in r["stages"][k]] for k in STAGES}
    return {
        "command": runs[-1]["command"],
        "fps": stat([r["fps"] for r in runs]),
        "wall_s": stat([r["wall_s"] for r in runs]),
        "startup_s": stat([r["startup_s"] for r in runs]),
        "messages": runs[-1]["messages"],
        "lossless": all(r["lossless"] and r["final_status"] == "ended" for r in runs),
        "engine": runs[-1]["engine"],
        "mean_batch": round(float(np.mean([r["mean_batch"] for r in runs])), 2),
        "peak_rss_mb": stat([r["peak_rss_mb"] for r in runs], 1),
        "steady_peak_rss_mb": stat([r["steady_peak_rss_mb"] for r in runs], 1),
        "background_cores": stat([r["background_cores"] for r in runs]),
        "cpu_ms_per_frame": stat([r["cpu_ms_per_frame"] for r in runs], 1),
        "stages_ms": {k: {**percentiles(pooled[k], (50, 95)), "mean": round(float(np.mean(pooled[k])), 1)}
                      for k in STAGES},
    }


def run_file_mode(clip: Path, label: str, model_path: Path, backend: str, overrides: dict[str, Any],
                  repeats: int, timeout_s: float, settle_s: float = 0.0) -> dict[str, Any]:
    """``repeats`` worker runs on ``clip``, summarized."""
    return summarize_file([run_file_once(clip, label, model_path, backend, overrides, timeout_s, settle_s)
                           for _ in range(repeats)])
