"""A clip with known ground truth for zones and lines: real people cut from vtest.avi, moved along known paths.

The background is the median of vtest frames (the empty scene); each walker is
a person patch cut from a vtest frame, scaled 2×, pasted so that its feet
follow a straight path at 10 px per frame, 10 fps. Three lanes keep walkers
well apart (feet at y 190, 380 and 570). A vertical line at x 400 counts
crossings (``in`` is to the right); a zone on the middle lane, left of the
line, is where two people stop.

Ground truth, by construction (:data:`EXPECTED`): 6 crossings in, 3 out; the
zone sees three visits: S1 stops 3 s and walks back out, E walks through
without stopping, S2 stops and is still standing there when the clip ends
(its exit comes when the stream ends: ``reason: lost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

W, H, FPS, SPEED = 768, 576, 10, 10
LANES = (190, 380, 570)
LINE = {"name": "door", "points": [[400, 575], [400, 5]], "in_side": "right"}
ZONE = {"name": "bench", "points": [[170, 300], [330, 300], [330, 450], [170, 450]], "min_dwell_s": 2.5}
SPRITES = ((465, 171, 498, 241, 10), (315, 209, 348, 293, 10), (363, 188, 395, 278, 20), (499, 162, 530, 222, 0))
"""Person boxes ``(x1, y1, x2, y2, frame)`` in vtest.avi that the default model finds with a score above 0.9."""

EXPECTED = {
    "door": {"in": 6, "out": 3},
    "bench": {"in": 3, "out": 3, "occupancy": 0},
    "bench_events": [("enter", "S1"), ("dwell", "S1"), ("exit", "S1"), ("enter", "E"), ("exit", "E"),
                     ("enter", "S2"), ("dwell", "S2"), ("exit", "S2")],
}


@dataclass(frozen=True)
class Walk:
    """One person: lane, x at which it appears, stops (``(x, frames)``) and where it vanishes."""

    name: str
    lane: int
    start_frame: int
    waypoints: tuple[tuple[float, int], ...]   # (x to walk to, frames to stand there)
    x0: float
    sprite: int


def schedule() -> list[Walk]:
    """Four phases of about 65 frames; lanes 0 and 2 carry the crossers, lane 1 the zone's visitors."""
    return [
        Walk("A", 0, 0, ((700, 0),), 90, 0),
        Walk("B", 2, 0, ((700, 0),), 90, 1),
        Walk("S1", 1, 0, ((250, 30), (60, 0)), 90, 2),
        Walk("C", 0, 70, ((90, 0),), 700, 3),
        Walk("D", 2, 70, ((700, 0),), 90, 0),
        Walk("E", 1, 80, ((700, 0),), 90, 1),
        Walk("F", 0, 150, ((700, 0),), 90, 2),
        Walk("G", 2, 150, ((90, 0),), 700, 3),
        Walk("S2", 1, 150, ((250, 10_000),), 60, 0),
        Walk("H", 0, 220, ((90, 0),), 700, 1),
        Walk("I", 2, 220, ((700, 0),), 90, 2),
    ]


def positions(walk: Walk) -> list[float]:
    """The feet's x on each frame from ``walk.start_frame`` until the person vanishes (last waypoint)."""
    xs, x = [walk.x0], walk.x0
    for target, stand in walk.waypoints:
        while abs(target - x) > 1e-6:
            x += max(-SPEED, min(SPEED, target - x))
            xs.append(x)
        xs += [x] * stand
    return xs


FRAMES = 290


def _vtest_frames(vtest: Path, wanted: set[int], median_every: int = 12, median_count: int = 40):
    frames, samples = {}, []
    with av.open(str(vtest)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted or (index % median_every == 0 and len(samples) < median_count):
                image = frame.to_ndarray(format="bgr24")
                if index in wanted:
                    frames[index] = image
                if index % median_every == 0:
                    samples.append(image)
            if len(samples) >= median_count and wanted <= frames.keys():
                break
    return frames, np.median(np.stack(samples), axis=0).astype(np.uint8)


def build_clip(vtest: Path, out: Path) -> Path:
    """Write the clip (H.264 MP4 via PyAV) and return its path."""
    frames, background = _vtest_frames(vtest, {s[4] for s in SPRITES})
    background = cv2.resize(background, (W, H))
    sprites = []
    for x1, y1, x2, y2, index in SPRITES:
        patch = frames[index][y1 - 3:y2 + 3, x1 - 3:x2 + 3]
        sprites.append(cv2.resize(patch, None, fx=2.0, fy=2.0, interpolation=cv2.INTER_CUBIC))
    tracks = [(walk, positions(walk)) for walk in schedule()]
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.time_base = Fraction(1, FPS)
        stream.options = {"crf": "18", "preset": "veryfast"}
        for f in range(FRAMES):
            canvas = background.copy()
            for walk, xs in tracks:
                i = f - walk.start_frame
                if 0 <= i < len(xs):
                    _paste(canvas, sprites[walk.sprite], xs[i], LANES[walk.lane])
            frame = av.VideoFrame.from_ndarray(canvas, format="bgr24")
            frame.pts = f
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return out


def _paste(canvas: np.ndarray, sprite: np.ndarray, feet_x: float, feet_y: int) -> None:
    h, w = sprite.shape[:2]
    x1, y1 = round(feet_x - w / 2), feet_y - h
    cx1, cy1, cx2, cy2 = max(x1, 0), max(y1, 0), min(x1 + w, W), min(feet_y, H)
    canvas[cy1:cy2, cx1:cx2] = sprite[cy1 - y1:cy2 - y1, cx1 - x1:cx2 - x1]
