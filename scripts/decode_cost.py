#!/usr/bin/env python
"""What a decoder thread's own work costs, alone: demux and decode, then RGB, then the letterbox, per frame.

The e2e / model-only ratio of file mode is inference / (inference + everything else) once the cores are
full, and most of "everything else" is this work, done on the same cores as the model. Measured outside
the pipeline, with the pipeline's own code (:class:`app.sources.rgb.RgbConverter`,
:func:`app.preprocess.letterbox_into` into a rectangular slot), so it is the floor of that share: no ring,
no hand-offs, no publishing, caches not shared with inference. Process CPU per frame (FFmpeg's frame
threads included), with FFmpeg's frame threading as file sources decode and with one codec thread; the
rounds alternate the two, and each figure is the median (min–max).

    python scripts/decode_cost.py [--clip vtest|bikes|PATH] [--rounds 7]

Prints the machine and one table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import av
import cv2
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.bench.clips import resolve_clip
from app.bench.machine import machine_info
from app.preprocess import fit_input_size, letterbox_into
from app.sources.rgb import RgbConverter

STEPS = ("decode", "decode + RGB", "decode + RGB + letterbox")
THREADING = {"frame threads": ("AUTO", 0), "one thread": ("SLICE", 1)}  # (thread_type, thread_count)
INPUT_MAX, STRIDE = 416, 32


def one_pass(clip: Path, step: int, threading: tuple[str, int]) -> float:
    """Process CPU ms per frame of one pass over ``clip`` doing steps ``0..step``."""
    container = av.open(str(clip))
    stream = container.streams.video[0]
    stream.thread_type, stream.thread_count = threading
    rgb_converter, slot, frames = RgbConverter(), None, 0
    started = time.process_time()
    try:
        for packet in container.demux(stream):
            for frame in packet.decode():
                frames += 1
                if step >= 1:
                    rgb = rgb_converter.convert(frame)
                if step >= 2:
                    if slot is None:
                        height, width = fit_input_size(rgb.shape[1], rgb.shape[0], INPUT_MAX, INPUT_MAX, STRIDE, True)
                        slot = np.empty((3, height, width), np.float32)
                    letterbox_into(rgb, slot)
    finally:
        container.close()
    return (time.process_time() - started) * 1e3 / max(frames, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", default="bikes")
    parser.add_argument("--rounds", type=int, default=7)
    opts = parser.parse_args(argv)
    clip = resolve_clip(opts.clip)
    cv2.setNumThreads(1)  # as in `detstream run`
    machine = machine_info()
    console = Console(width=max(Console().width, 120))
    console.print(f"Machine: {machine['cpu']}, {machine['physical_cores']} cores, PyAV {machine['pyav']}, "
                  f"OpenCV {machine['opencv']}, commit {machine['commit']}")
    console.print(f"{clip.name}: {opts.rounds} rounds of {len(STEPS) * len(THREADING)} passes...")
    samples: dict[tuple[str, int], list[float]] = {(mode, step): [] for mode in THREADING for step in range(len(STEPS))}
    for _ in range(opts.rounds):
        for mode, threading in THREADING.items():
            for step in range(len(STEPS)):
                samples[mode, step].append(one_pass(clip, step, threading))
    table = Table(title=f"Decoder-thread work alone, {clip.name}: process CPU ms per frame, median (min–max)")
    table.add_column("work")
    for mode in THREADING:
        table.add_column(mode)
    for step, name in enumerate(STEPS):
        table.add_row(name, *(_text(samples[mode, step]) for mode in THREADING))
    console.print(table)
    return 0


def _text(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


if __name__ == "__main__":
    raise SystemExit(main())
