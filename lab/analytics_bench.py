"""What zones and lines cost the postprocess thread per frame (issue 24's budget: 0.3 ms).

    python -m lab.analytics_bench [--cameras 8] [--people 12] [--frames 3000]

Synthetic 768×576 cameras at 5 fps, each with 2 zones and 2 lines (the
shapes of configs/example.yaml, normalized) and ``--people`` walkers crossing
the scene on straight paths, so that regions see real enters, exits and
crossings. Frames are interleaved across cameras as the postprocess thread
sees them. It reports the thread CPU per frame of :meth:`Analytics.update`
alone (tracks given), and of ByteTrack + analytics (what a source whose
``tracking:`` was ``none`` pays in all once it has zones), against ByteTrack
alone. Prints one JSON object, with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from app.analytics.engine import Analytics
from app.config import parse_config
from app.postprocess.tracking import StreamTrackers
from app.types import Detections, FrameMeta, Letterbox

W, H, FPS = 768, 576, 5.0
ZONES = [{"name": "door", "units": "normalized", "points": [[0.05, 0.55], [0.35, 0.55], [0.35, 0.95], [0.05, 0.95]],
          "min_dwell_s": 3},
         {"name": "yard", "units": "normalized", "points": [[0.55, 0.3], [0.95, 0.3], [0.9, 0.9], [0.6, 0.85]]}]
LINES = [{"name": "mid", "units": "normalized", "points": [[0.5, 0.95], [0.5, 0.1]]},
         {"name": "cross", "units": "normalized", "points": [[0.05, 0.5], [0.95, 0.5]]}]


def walkers(people: int, frames: int, seed: int) -> list[Detections]:
    """``frames`` frames of ``people`` boxes walking straight lines across the frame, with ids 1..people."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([0, 100], [W, H], size=(people, 2))
    speed = rng.uniform(-12, 12, size=(people, 2))
    out = []
    for f in range(frames):
        feet = (start + speed * f) % [W, H]
        xyxy = np.stack([feet[:, 0] - 20, feet[:, 1] - 90, feet[:, 0] + 20, feet[:, 1]], 1).clip(0, [W, H, W, H])
        xyxy[:, 3] = np.maximum(xyxy[:, 3], xyxy[:, 1] + 1)
        out.append(Detections(xyxy.astype(np.float32), np.full(people, 0.8, np.float32),
                              np.zeros(people, np.int32), np.arange(1, people + 1, dtype=np.int64)))
    return out


def cpu() -> str:
    """The CPU as /proc/cpuinfo has it, with family and model, since the name alone may say only "AMD EPYC"."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}), "
            f"{len(os.sched_getaffinity(0))} cores")


def measure(cameras: int, people: int, frames: int) -> dict:
    sources = [{"url": f"cam{i}.mp4", "id": f"cam{i}", "zones": ZONES, "lines": LINES} for i in range(cameras)]
    config = parse_config({"sources": sources})
    per_camera = max(frames // cameras, 1)
    clips = [walkers(people, per_camera, seed) for seed in range(cameras)]
    letterbox = Letterbox(1.0, 0, 0, W, H)
    alive = set(range(1, people + 1))

    def run(track: bool, analyse: bool) -> float:
        analytics = Analytics(config.sources, ("person",))
        trackers = StreamTrackers()
        events = 0
        t0 = time.thread_time()
        for f in range(per_camera):
            for c in range(cameras):
                sid = f"cam{c}"
                dets = clips[c][f]
                ids = alive
                if track:
                    dets = trackers.update(sid, dets, FPS)
                    ids = trackers.alive(sid)
                if analyse:
                    meta = FrameMeta(sid, f, f / FPS, 0.0, 0.0, 0.0, letterbox)
                    events += len(analytics.update(meta, dets, ids).events)
        elapsed = time.thread_time() - t0
        run.events = events  # type: ignore[attr-defined]
        return elapsed * 1e3 / (per_camera * cameras)

    run(False, True)  # warm-up
    analytics_ms = min(run(False, True) for _ in range(3))
    events = run.events  # type: ignore[attr-defined]
    tracking_ms = min(run(True, False) for _ in range(2))
    both_ms = min(run(True, True) for _ in range(2))
    return {"cameras": cameras, "people_per_frame": people, "frames": per_camera * cameras,
            "events": events, "analytics_ms_per_frame": round(analytics_ms, 4),
            "bytetrack_ms_per_frame": round(tracking_ms, 4),
            "bytetrack_plus_analytics_ms_per_frame": round(both_ms, 4), "cpu": cpu()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=8)
    parser.add_argument("--people", type=int, default=12)
    parser.add_argument("--frames", type=int, default=3000, help="in all, across the cameras")
    args = parser.parse_args()
    print(json.dumps(measure(args.cameras, args.people, args.frames)))


if __name__ == "__main__":
    main()
