"""Valid detection and status payloads for the subscriber tests."""

from __future__ import annotations


def detection(stream: str, seq: int, dropped_before: int = 0, labels=("person", "person", "car")) -> dict:
    return {
        "schema": "detstream.detections/1", "stream": stream, "seq": seq, "pts": seq / 25, "captured_at": 1.0e9,
        "published_at": 1.0e9 + 0.05, "width": 640, "height": 480, "dropped_before": dropped_before,
        "latency_ms": {"decode": 1.0, "queue": 2.0, "infer": 30.0, "post": 1.0, "total": 48.0},
        "model": "yolov3-tiny", "engine": "onnxruntime:CPUExecutionProvider",
        "detections": [
            {"label": label, "class_id": 0 if label == "person" else 2, "score": 0.9,
             "box": [10.0 + i, 20.0, 50.0 + i, 90.0], "track_id": None}
            for i, label in enumerate(labels)
        ],
    }


def status(stream: str, state: str = "running") -> dict:
    return {"schema": "detstream.status/1", "stream": stream, "state": state, "reason": "", "attempt": 0,
            "retry_in_s": None, "at": 1.0e9, "frames": 10, "dropped": 0}
