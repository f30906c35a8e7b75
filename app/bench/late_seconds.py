"""Which seconds of a long live run were late, and what the machine was doing just before each.

Why: over ten minutes, p99 and drops are set by a few seconds, and three causes look alike in the
messages (``total`` and ``infer`` rise together):

* **the host was slower**: each frame took more CPU time than usual (a busy neighbour on the host, a
  lower clock). The worker's CPU per published frame rises;
* **other processes** on this machine took the cores: the machine's busy time exceeds the worker's;
* **neither**: the frames cost what they always cost and the cores were the worker's, so the
  pipeline itself was late (frames arriving together, a stall). Only these are ours to fix.

A backlog builds over seconds, so each second is judged by the ``lookback_s`` before its end. A host
hiccup of about one second barely moves a 3-s average (+5 % in the three such seconds of two 10-minute
runs, under the 1.1× rule), so the CPU per frame of each single second inside the lookback is checked
too: the worst of them at 1.1× the median of single seconds also makes the host slower. All
times are the bench's monotonic clock: message arrival at the subscriber and the 0.1 s CPU samples
(:class:`app.bench.common.RssSampler`). The drift of the test cameras into step (fixed in 33a97dd) was
found this way: 43 "neither" seconds in one plateau, from the eighth loop of the camera files on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

LATE_MS = 150.0
"""A second is late when the p99 latency of the frames published in it exceeds this (the live target)."""
LOOKBACK_S = 3.0
"""How far before the end of a late second its cause is looked for."""
SLOWER = 1.1
"""CPU per frame at least this many times the run's median: the host was slower."""
BUSY_CORES = 0.2
"""Other processes using at least this many cores (the bench's own quiet threshold) took the CPU."""
MAX_ROWS = 100
CAUSES = ("host slower", "other processes", "neither")

Between = Callable[[float, float], float | None]


def second_by_second(arrivals: list[tuple[dict[str, Any], float]], cpu_between: Between,
                     background_between: Between, late_ms: float = LATE_MS,
                     lookback_s: float = LOOKBACK_S) -> dict[str, Any]:
    """Per second of arrival time: frames, p99 capture-to-publish latency, drops, the worker's CPU per
    frame and other processes' cores over the ``lookback_s`` before the second's end, and the worker's CPU
    per frame of that second alone; then each late second with its cause (see the module docstring) and the
    worst single-second CPU per frame in its lookback.

    ``arrivals`` are (payload, arrival time) in arrival order; ``cpu_between`` and
    ``background_between`` give CPU seconds between two times of the same clock (None without samples).
    """
    if not arrivals:
        return {}
    t = np.array([arrival for _, arrival in arrivals])
    latency = np.array([(p["published_at"] - p["captured_at"]) * 1e3 for p, _ in arrivals])
    dropped = np.array([p["dropped_before"] for p, _ in arrivals])
    start = float(t[0])
    seconds = int(t[-1] - start) + 1
    edges = np.searchsorted(t, start + np.arange(seconds + 1), side="left")
    series: dict[str, list[Any]] = {"frames": [], "p99_ms": [], "drops": [], "cpu_ms_per_frame": [],
                                    "cpu_ms_per_frame_1s": [], "background_cores": []}
    for second in range(seconds):
        lo, hi = edges[second], edges[second + 1]
        end = start + second + 1
        back = max(start, end - lookback_s)
        frames_back = int(np.searchsorted(t, end) - np.searchsorted(t, back))
        cpu_s, other_s = cpu_between(back, end), background_between(back, end)
        cpu_1s = cpu_between(end - 1, end)
        series["frames"].append(int(hi - lo))
        series["p99_ms"].append(round(float(np.percentile(latency[lo:hi], 99)), 1) if hi > lo else None)
        series["drops"].append(int(dropped[lo:hi].sum()))
        series["cpu_ms_per_frame"].append(round(cpu_s * 1e3 / frames_back, 2)
                                          if cpu_s is not None and frames_back else None)
        series["cpu_ms_per_frame_1s"].append(round(cpu_1s * 1e3 / (hi - lo), 2)
                                             if cpu_1s is not None and hi > lo else None)
        series["background_cores"].append(round(other_s / (end - back), 2) if other_s is not None else None)
    median_cpu = _median(series["cpu_ms_per_frame"])
    median_1s = _median(series["cpu_ms_per_frame_1s"])
    span = max(1, round(lookback_s))
    late = []
    for second, p99 in enumerate(series["p99_ms"]):
        if p99 is None or p99 <= late_ms:
            continue
        row = {key: values[second] for key, values in series.items()}
        within = [c for c in series["cpu_ms_per_frame_1s"][max(0, second - span + 1):second + 1] if c is not None]
        row["worst_second_cpu_ms"] = max(within) if within else None
        late.append({"t_s": second, **row, "cause": _cause(row, median_cpu, median_1s)})
    return {
        "late_ms": late_ms,
        "lookback_s": lookback_s,
        "seconds": seconds,
        "cpu_ms_per_frame_median": round(median_cpu, 2) if median_cpu is not None else None,
        "late_seconds": len(late),
        "late_drops": sum(row["drops"] for row in late),
        "causes": {cause: n for cause, n in Counter(row["cause"] for row in late).items()},
        "late": late[:MAX_ROWS],
        "series": series,
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def _cause(row: dict[str, Any], median_cpu: float | None, median_1s: float | None) -> str:
    background, cpu, worst = row["background_cores"], row["cpu_ms_per_frame"], row["worst_second_cpu_ms"]
    if background is not None and background >= BUSY_CORES:
        return "other processes"
    if cpu is not None and median_cpu and cpu >= SLOWER * median_cpu:
        return "host slower"
    if worst is not None and median_1s and worst >= SLOWER * median_1s:
        return "host slower"
    return "neither"


def late_text(k: int, anatomy: dict[str, Any]) -> str:
    """One report line: how many seconds were late, why, and what a frame cost then against usually."""
    if not anatomy:
        return ""
    n = anatomy["late_seconds"]
    head = (f"K={k}, second by second: {n} of {anatomy['seconds']} s had p99 > {anatomy['late_ms']:g} ms; "
            f"a frame took a median {anatomy['cpu_ms_per_frame_median']} ms of worker CPU")
    if not n:
        return head
    causes = ", ".join(f"{cause} {anatomy['causes'].get(cause, 0)}" for cause in CAUSES)
    cpu = [row["cpu_ms_per_frame"] for row in anatomy["late"] if row["cpu_ms_per_frame"] is not None]
    cpu_text = f", {min(cpu):g}–{max(cpu):g} ms in the late seconds" if cpu else ""
    return (f"{head}{cpu_text}. Causes (the {anatomy['lookback_s']:g} s before each): {causes}; "
            f"{anatomy['late_drops']} drops fell in late seconds")
