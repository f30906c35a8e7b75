"""The machine a benchmark ran on: CPU, cores, memory, library versions, providers, load, commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from app.bench.common import REPO_ROOT


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The SIMD flags that decide ONNX Runtime's kernels (AVX2, AVX-512, VNNI)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
                return [f for f in wanted if f in flags]
    except OSError:
        pass
    return []


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def machine_info() -> dict[str, Any]:
    import av
    import cv2
    import numpy as np
    import onnxruntime as ort

    from app.engines.onnxruntime import physical_cores

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "physical_cores": physical_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "numpy": np.__version__,
        "opencv": cv2.__version__,
        "pyav": av.__version__,
        "load_avg_at_start": [round(x, 2) for x in load],
        "commit": git_commit(),
    }
