"""The vectorised ByteTracker gives the same ids as the per-track reference, frame by frame.

Scenes are generated from a seed: walkers that appear and leave at random
frames, cross each other, vanish for a few frames (occlusion), come back with a
low score or jittered box, walk in pairs where one often hides the other, plus
false positives, near-duplicate boxes and rows in shuffled order. The
reference (``bytetrack_reference.py``) is the plain per-track implementation;
only the ids and the set of alive ids are compared, since vectorised arithmetic
may round differently.

Walkers leave the picture rather than shrink to identical slivers at its edge:
two tracks with bit-identical boxes facing two identical boxes make an exact
tie between two assignments, which the solver breaks on the last-bit rounding
of other cells of the cost matrix, in either implementation.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.postprocess.bytetrack import ByteTracker
from tests.unit.postprocess.bytetrack_reference import ByteTracker as ReferenceTracker
from tests.unit.postprocess.bytetrack_reference import TrackState, iou_matrix

W, H = 768, 576


def scene(seed: int, frames: int = 150, walkers: int = 16) -> list[tuple[np.ndarray, np.ndarray]]:
    """``frames`` frames of (xyxy float64 (n, 4), scores float64 (n,)) from the seed."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([0, 60], [W, H], size=(walkers, 2))
    speed = rng.uniform(-14, 14, size=(walkers, 2))
    size = rng.uniform([15, 40], [60, 140], size=(walkers, 2))
    born = rng.integers(0, frames // 2, walkers)
    born[: walkers // 4] = 0
    dies = born + rng.integers(10, frames, walkers)
    hidden = np.full(walkers, 0.08)  # chance of being occluded in a frame
    for i in range(walkers // 4, walkers // 2):  # walks a few pixels behind another one, often hidden by it
        j = i + walkers // 2
        start[i], speed[i], size[i] = start[j] + rng.uniform(-4, 4, 2), speed[j], size[j]
        born[i], dies[i] = born[j], dies[j]
        hidden[i] = 0.4
    out = []
    for f in range(frames):
        boxes, scores = [], []
        for i in range(walkers):
            if not born[i] <= f < dies[i] or rng.random() < hidden[i]:  # not there, or occluded this frame
                continue
            cx, cy = start[i] + speed[i] * (f - born[i]) + rng.normal(0, 2, 2)
            w, h = size[i] * rng.uniform(0.9, 1.1, 2)
            box = np.clip([cx - w / 2, cy - h, cx + w / 2, cy], 0, [W, H, W, H])
            if (box[2] - box[0]) * (box[3] - box[1]) < w * h / 2:  # mostly out of the picture: not detected
                continue
            boxes.append(box.tolist())
            roll = rng.random()
            scores.append(rng.uniform(0.11, 0.25) if roll < 0.15 else rng.uniform(0.02, 0.1) if roll < 0.2
                          else rng.uniform(0.3, 0.95))
            if rng.random() < 0.03:  # a near-duplicate box of the same walker
                boxes.append([v + rng.normal(0, 2) for v in boxes[-1]])
                scores.append(rng.uniform(0.3, 0.9))
        for _ in range(rng.poisson(0.7)):  # false positives
            x, y = rng.uniform([0, 0], [W, H])
            boxes.append([x, y, x + rng.uniform(10, 80), y + rng.uniform(10, 120)])
            scores.append(rng.uniform(0.05, 0.6))
        order = rng.permutation(len(boxes))
        xyxy = np.array(boxes, np.float64).reshape(-1, 4)[order].clip(0, [W, H, W, H])
        out.append((xyxy, np.array(scores, np.float64)[order]))
    return out


SETTINGS = [
    {},
    {"lost_track_buffer": 6, "frame_rate": 10.0},
    {"track_activation_threshold": 0.5, "minimum_matching_threshold": 0.9, "frame_rate": 5.0},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "short-buffer", "strict-5fps"])
@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_tracker_gives_the_reference_ids_on_every_frame(seed, settings):
    fast, reference = ByteTracker(**settings), ReferenceTracker(**settings)
    for frame, (xyxy, scores) in enumerate(scene(seed)):
        expected = reference.update(xyxy.copy(), scores.copy())
        got = fast.update(xyxy.copy(), scores.copy())
        assert got.tolist() == expected.tolist(), f"frame {frame}"
        assert fast.alive_ids() == reference.alive_ids(), f"frame {frame}"
        assert fast.frame_id == reference.frame_id


def test_the_scenes_exercise_refinding_ambiguous_matches_and_duplicate_removal(monkeypatch):
    duplicates = []
    retire = ReferenceTracker._retire

    def counting_retire(self, tracks):
        retire(self, tracks)
        held = sum(t.state in (TrackState.TRACKED, TrackState.LOST) for t in tracks)
        duplicates.append(held - len(self._tracked) - len(self._lost))

    monkeypatch.setattr(ReferenceTracker, "_retire", counting_retire)
    ids_given, refound, ambiguous = 0, 0, 0
    for seed in range(6):
        reference, ids_seen = ReferenceTracker(**SETTINGS[1]), set()
        for xyxy, scores in scene(seed):
            lost_before = {t.track_id for t in reference._lost}
            ids = reference.update(xyxy, scores)
            refound += len(lost_before & set(ids.tolist()))
            ids_seen |= set(ids.tolist()) - {-1}
            ambiguous += int((((1 - iou_matrix(xyxy, xyxy)) < 0.8).sum(axis=1) > 1).any())
        ids_given += len(ids_seen)
    assert refound > 0 and ambiguous > 60 and ids_given > 6 * 16 and sum(duplicates) > 0


def test_empty_frames_and_a_first_frame_without_detections_agree():
    fast, reference = ByteTracker(), ReferenceTracker()
    frames = [(np.zeros((0, 4)), np.zeros(0))] + scene(3, frames=20) + [(np.zeros((0, 4)), np.zeros(0))] * 3
    for xyxy, scores in frames + scene(3, frames=20):
        assert fast.update(xyxy, scores).tolist() == reference.update(xyxy, scores).tolist()
        assert fast.alive_ids() == reference.alive_ids()

