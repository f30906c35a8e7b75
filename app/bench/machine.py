"""The machine a benchmark ran on: CPU, memory, library versions, providers, commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from app.bench.results import Machine
from app.bench.worker import REPO_ROOT
from app.engines.probe import probe_machine

SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
"""The CPU flags that decide the CPU engines' kernels: whether INT8 pays, whether bf16 runs natively."""


def _cpuinfo(key: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def git_commit() -> str:
    """``abc1234`` (``+dirty`` with uncommitted changes to tracked files), or ``unknown`` outside a checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def machine_info() -> Machine:
    import onnxruntime as ort

    flags = set(_cpuinfo("flags").split())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Machine(
        cpu=_cpuinfo("model name") or platform.processor() or platform.machine(),
        cpu_flags=[f for f in SIMD_FLAGS if f in flags],
        logical_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        memory_gb=round(memory / 2**30, 1),
        os=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
        onnxruntime=ort.__version__,
        providers=ort.get_available_providers(),
        openvino=probe_machine().openvino.version,
        commit=git_commit(),
    )
