#!/usr/bin/env python
"""Is fp32 inference already as fast as this CPU computes? yolov3-tiny on ONNX Runtime against a big SGEMM.

One thread each, as each CPU worker of the pipeline runs: the model's convolution GFLOP per frame at the
input sizes the pipeline uses, ONNX Runtime's thread CPU per frame and the GFLOP/s that makes, and numpy's
2048³ float32 matrix multiply as the core's practical peak, measured in alternation (app/bench/arithmetic.py).

    python scripts/fp32_peak.py [--model models/yolov3-tiny.onnx] [--rounds 6] [--json PATH]

Prints the machine and one table; the last column is what share of the core's peak inference reaches.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core's rate: set before numpy loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # after the thread settings above: numpy reads them when it loads
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench.arithmetic import measure
from app.bench.machine import machine_info

SIZES = [(416, 416), (320, 416), (192, 416)]  # square, vtest's and bikes' rectangular inputs (height, width)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    if not opts.model.exists():
        raise SystemExit(f"{opts.model}: no such model (make models fetches the default one)")
    machine = machine_info()
    console = Console(width=max(Console().width, 120))
    console.print(f"Machine: {machine['cpu']}, {machine['physical_cores']} cores, onnxruntime "
                  f"{machine['onnxruntime']}, numpy {machine['numpy']}, commit {machine['commit']}")
    console.print(f"Measuring {opts.rounds} rounds, one thread (~{opts.rounds * 3} s)...")
    rows = measure(opts.model, SIZES, opts.rounds)
    table = Table(title=f"fp32 arithmetic rate, one thread ({opts.model.name}; medians, min–max)")
    for column in ("input", "GFLOP / frame", "ORT ms / frame", "ORT GFLOP/s", "SGEMM GFLOP/s", "ORT / SGEMM"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["input"], str(row["gflop_per_frame"]), _text(row["ort_ms_per_frame"]),
                      _text(row["ort_gflops"]), _text(row["sgemm_gflops"]), str(row["ort_of_sgemm"]))
    console.print(table)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
        console.print(f"written {opts.json}")
    return 0


def _text(spread: dict[str, float]) -> str:
    return f"{spread['median']} ({spread['min']}–{spread['max']})"


if __name__ == "__main__":
    raise SystemExit(main())
