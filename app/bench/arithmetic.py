"""How close fp32 inference runs to what one CPU core can compute: the model's convolution FLOPs per frame,
ONNX Runtime's rate on them, and a large SGEMM's rate on the same core as the practical peak.

Why. Two of the performance targets (8 fp32 cameras, bikes' ratio to model-only) are a question of how much
CPU is left beside inference. If inference already computes as fast as the core's best matrix multiply,
no session option, thread layout or kernel choice can make fp32 cheaper: only less arithmetic can (INT8,
smaller inputs). ``scripts/fp32_peak.py`` prints the table.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SGEMM_N = 2048


def conv_gflop(model_path: Path | str, height: int, width: int) -> float:
    """Multiply-adds ×2 of every ``Conv`` for one frame at ``height`` × ``width``, in GFLOP.

    Output sizes come from ONNX shape inference with the input fixed at ``(1, C, height, width)``;
    grouped convolutions count their groups. Only convolutions count: in a YOLO they are over 99 % of
    the arithmetic.
    """
    import onnx

    model = onnx.load(str(model_path))
    image = model.graph.input[0]
    dims = image.type.tensor_type.shape.dim
    for dim, size in zip(dims, (1, dims[1].dim_value or 3, height, width), strict=True):
        dim.ClearField("dim_param")
        dim.dim_value = size
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
              for value in [*inferred.graph.value_info, *inferred.graph.output]}
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    flop = 0
    for node in inferred.graph.node:
        if node.op_type != "Conv":
            continue
        out = shapes.get(node.output[0])
        kernel = weights.get(node.input[1])
        if not out or kernel is None or len(out) != 4 or not all(out):
            raise ValueError(f"{model_path}: cannot size Conv {node.name or node.output[0]} at {height}x{width}")
        # weight (M, C/group, kH, kW): each output element takes C/group * kH * kW multiply-adds
        flop += 2 * int(np.prod(kernel)) * out[2] * out[3]
    return flop / 1e9


def sgemm_gflops(n: int = SGEMM_N, repeats: int = 3) -> float:
    """numpy's float32 ``n``×``n`` matrix multiply on the calling thread, GFLOP/s of thread CPU.

    The caller sets ``OPENBLAS_NUM_THREADS=1`` (before numpy loads) so that this is one core's rate.
    """
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
    a @ b
    started = time.thread_time()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.thread_time() - started) / 1e9


def one_thread_sgemm_gflops(rounds: int = 3) -> float | None:
    """The best of ``rounds`` :func:`sgemm_gflops` in a child process pinned to one BLAS thread; None if it fails.

    A child, because a process's BLAS thread count is fixed when numpy loads (the bench's own numpy uses
    every core).
    """
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    code = ("from app.bench.arithmetic import sgemm_gflops; "
            f"print(max(sgemm_gflops(repeats=2) for _ in range({int(rounds)})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                              check=True, cwd=Path(__file__).resolve().parents[2])
        return round(float(done.stdout.strip().splitlines()[-1]), 1)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def ort_session(model_path: Path | str) -> Any:
    """The model on ONNX Runtime's CPU provider, one intra-op thread, as each pipeline worker runs it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def ort_ms_per_frame(session: Any, input_name: str, frame: np.ndarray, runs: int = 10) -> float:
    """Thread CPU per run of one ``(1, 3, H, W)`` frame, in ms (the runs stay on this thread)."""
    started = time.thread_time()
    for _ in range(runs):
        session.run(None, {input_name: frame})
    return (time.thread_time() - started) / runs * 1e3


def measure(model_path: Path | str, sizes: list[tuple[int, int]], rounds: int = 6) -> list[dict[str, Any]]:
    """Per input size: GFLOP per frame, ORT's ms and GFLOP/s, and SGEMM's GFLOP/s measured in alternation.

    Each round runs the model at every size and then the SGEMM, so that both see the same host speed;
    figures are medians over the rounds, with their min–max.
    """
    session = ort_session(model_path)
    name = session.get_inputs()[0].name
    rng = np.random.default_rng(1)
    frames = {hw: rng.random((1, 3, *hw), np.float32) for hw in sizes}
    gflop = {hw: conv_gflop(model_path, *hw) for hw in sizes}
    for hw in sizes:
        ort_ms_per_frame(session, name, frames[hw], runs=2)  # first runs at a shape plan its buffers
    ms: dict[tuple[int, int], list[float]] = {hw: [] for hw in sizes}
    sgemm: list[float] = []
    for _ in range(rounds):
        for hw in sizes:
            ms[hw].append(ort_ms_per_frame(session, name, frames[hw]))
        sgemm.append(sgemm_gflops())
    rows = []
    for hw in sizes:
        rates = [gflop[hw] / (m / 1e3) for m in ms[hw]]
        rows.append({
            "input": f"{hw[1]}x{hw[0]}",
            "gflop_per_frame": round(gflop[hw], 3),
            "ort_ms_per_frame": _spread(ms[hw]),
            "ort_gflops": _spread(rates),
            "sgemm_gflops": _spread(sgemm),
            "ort_of_sgemm": round(statistics.median(rates) / statistics.median(sgemm), 3),
        })
    return rows


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}
