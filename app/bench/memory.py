"""Benchmark 5, memory: peak RSS of the worker's process tree with 1 and with K live streams.

Reuses live runs already made for the same K (the live search keeps them),
so that memory costs no extra run when the live benchmark went first. RSS is
sampled every 0.1 s with psutil over the worker and its children, and the
kernel's high-water mark (``VmHWM``) of the worker is taken too.

A run that keeps up touches only a few slots of the frame ring, whose pageable
pages become resident once written; a backlog writes them all. So each peak
also gets a bound with the whole ring resident: the peak once running plus the
ring's size, or the start-up peak (model load) if that is higher
(docs/operations.md, "Memory").
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.bench.common import stat
from app.bench.live_mode import LiveSettings, run_live_once


def run_memory(settings: LiveSettings, low_k: int, high_k: int, repeats: int,
               cache: dict[int, list[dict[str, Any]]], ring_mb: Callable[[int], float]) -> dict[str, Any]:
    """``ring_mb(k)``: the size of the frame ring a worker with ``k`` streams allocates (MB)."""
    with tempfile.TemporaryDirectory(prefix="detstream-bench-") as tmp:
        for k in (low_k, high_k):
            missing = repeats - len(cache.get(k, []))
            for _ in range(max(0, missing)):
                cache.setdefault(k, []).append(run_live_once(settings, k, Path(tmp)))
    low = stat([r["peak_rss_mb"] for r in cache[low_k]], 1)
    high = stat([r["peak_rss_mb"] for r in cache[high_k]], 1)
    per_stream = (high["median"] - low["median"]) / (high_k - low_k)
    steady_low = stat([r["steady_peak_rss_mb"] for r in cache[low_k]], 1)
    steady_high = stat([r["steady_peak_rss_mb"] for r in cache[high_k]], 1)
    # a backlog comes while running, after the start-up transient (model load) is gone
    running_low, running_high = steady_low["median"] + ring_mb(low_k), steady_high["median"] + ring_mb(high_k)
    return {
        "low_k": low_k,
        "high_k": high_k,
        "peak_rss_mb_low": low,
        "peak_rss_mb_high": high,
        "rss_per_stream_mb": round(per_stream, 1),
        "steady_rss_per_stream_mb": round((steady_high["median"] - steady_low["median"]) / (high_k - low_k), 1),
        "steady_peak_rss_mb_low": steady_low,
        "steady_peak_rss_mb_high": steady_high,
        "hwm_mb_low": stat([r["hwm_mb"] for r in cache[low_k]], 1),
        "hwm_mb_high": stat([r["hwm_mb"] for r in cache[high_k]], 1),
        "ring_mb_low": round(ring_mb(low_k), 1),
        "ring_mb_high": round(ring_mb(high_k), 1),
        "worst_rss_mb_low": round(max(low["median"], running_low), 1),
        "worst_rss_mb_high": round(max(high["median"], running_high), 1),
        "worst_rss_per_stream_mb": round((running_high - running_low) / (high_k - low_k), 1),
        "note": "peak = largest psutil sample (every 0.1 s) of the worker's process tree over the whole run; "
                "steady = the same from the first message on (no start-up transient); hwm = kernel VmHWM; "
                "worst = the larger of the peak and the running (steady) peak plus the whole frame ring, which any "
                "backlog makes resident: an upper bound; worst per stream from the running figures",
    }
