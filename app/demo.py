"""The built-in demo: vtest.avi (pedestrians, from Debian's opencv-doc) with the default model.

``configs/demo.yaml`` is the same configuration as a file; a test keeps the two equal.
"""

from __future__ import annotations

from pathlib import Path

from app.config import DetstreamConfig, parse_config

DEMO_CLIP = "vtest.avi"
DEMO_ZONE = {"name": "junction", "points": [[480, 170], [700, 150], [740, 300], [520, 320]], "classes": ["person"],
             "min_dwell_s": 3}
DEMO_LINE = {"name": "crossing", "points": [[384, 330], [384, 140]], "classes": ["person"]}
"""The demo's zone and line on vtest's scene (docs/analytics.md): the run ends with their counts."""


def demo_tree(clip_path: Path) -> dict:
    """The demo configuration as a plain tree (what configs/demo.yaml holds)."""
    return {
        "sources": [{"id": "vtest", "url": str(clip_path), "mode": "file", "zones": [DEMO_ZONE], "lines": [DEMO_LINE]}],
        "model": {"name": "yolov3-tiny", "conf_threshold": 0.25, "iou_threshold": 0.45},
        "engine": {"backend": "auto", "max_batch": 4, "max_wait_ms": 10},
        "publish": {"endpoint": "tcp://127.0.0.1:5555", "encoding": "json"},
        "annotate": {"dir": "out", "snapshots": 5},
        "http": {"enabled": True, "host": "127.0.0.1", "port": 8080},
    }


def demo_config(cache_dir: Path | None = None) -> DetstreamConfig:
    """Fetch the demo clip if needed and return the demo configuration."""
    from app.assets import fetch_clip

    return parse_config(demo_tree(fetch_clip(DEMO_CLIP, cache_dir)))
