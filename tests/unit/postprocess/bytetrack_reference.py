"""The per-track ByteTrack that ``app.postprocess.bytetrack`` must agree with, id for id.

A plain re-implementation, one Kalman filter object per track, written for
reading rather than speed: ``tests/unit/postprocess/test_bytetrack_equivalence.py``
runs it beside the vectorised :class:`app.postprocess.bytetrack.ByteTracker` on
generated scenes and asserts both give every detection the same id. Only the
settings fields come from the app's class; the steps are its own (its own IoU,
matching and lost-track limit), so a change to the app's algorithm cannot change
the oracle too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from app.postprocess.bytetrack import ByteTracker as FastTracker

_STD_POSITION = 1.0 / 20
_STD_VELOCITY = 1.0 / 160
_F = np.eye(8) + np.eye(8, k=4)
_H = np.eye(4, 8)


def _xyxy_to_xyah(box: np.ndarray) -> np.ndarray:
    width, height = box[2] - box[0], box[3] - box[1]
    return np.array([box[0] + width / 2, box[1] + height / 2, width / max(height, 1e-6), height])


def _xyah_to_xyxy(xyah: np.ndarray) -> np.ndarray:
    width = xyah[2] * xyah[3]
    return np.array([xyah[0] - width / 2, xyah[1] - xyah[3] / 2, xyah[0] + width / 2, xyah[1] + xyah[3] / 2])


class TrackState(Enum):
    NEW = 0
    TRACKED = 1
    LOST = 2
    REMOVED = 3


@dataclass(slots=True)
class _Track:
    """One track: Kalman state, lifecycle and the input row it matched this frame."""

    mean: np.ndarray
    covariance: np.ndarray
    score: float
    start_frame: int
    frame_id: int
    row: int
    state: TrackState = TrackState.NEW
    is_activated: bool = False
    track_id: int = -1

    @classmethod
    def start(cls, box: np.ndarray, score: float, frame_id: int, row: int) -> _Track:
        measurement = _xyxy_to_xyah(box)
        h = measurement[3]
        std = np.array([2 * _STD_POSITION * h, 2 * _STD_POSITION * h, 1e-2, 2 * _STD_POSITION * h,
                        10 * _STD_VELOCITY * h, 10 * _STD_VELOCITY * h, 1e-5, 10 * _STD_VELOCITY * h])
        mean = np.concatenate([measurement, np.zeros(4)])
        return cls(mean, np.diag(std**2), score, frame_id, frame_id, row, TrackState.TRACKED, frame_id == 1)

    @property
    def xyxy(self) -> np.ndarray:
        return _xyah_to_xyxy(self.mean[:4])

    def predict(self) -> None:
        mean = self.mean.copy()
        if self.state is not TrackState.TRACKED:
            mean[7] = 0.0
        h = mean[3]
        std = np.array([_STD_POSITION * h, _STD_POSITION * h, 1e-2, _STD_POSITION * h,
                        _STD_VELOCITY * h, _STD_VELOCITY * h, 1e-5, _STD_VELOCITY * h])
        self.mean = _F @ mean
        self.covariance = _F @ self.covariance @ _F.T + np.diag(std**2)

    def correct(self, box: np.ndarray, score: float, frame_id: int, row: int) -> None:
        """Kalman update with a matched detection; the track is (again) tracked and confirmed."""
        h = self.mean[3]
        std = np.array([_STD_POSITION * h, _STD_POSITION * h, 1e-1, _STD_POSITION * h])
        projected_cov = _H @ self.covariance @ _H.T + np.diag(std**2)
        gain = np.linalg.solve(projected_cov, (self.covariance @ _H.T).T).T
        innovation = _xyxy_to_xyah(box) - _H @ self.mean
        self.mean = self.mean + gain @ innovation
        self.covariance = self.covariance - gain @ projected_cov @ gain.T
        self.score, self.frame_id, self.row = score, frame_id, row
        self.state, self.is_activated = TrackState.TRACKED, True


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``(n, 4)`` and ``(m, 4)`` xyxy boxes, ``(n, m)``."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _match(cost: np.ndarray, threshold: float) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Minimum-cost assignment where no pair costs more than ``threshold``; (matches, unmatched rows, cols)."""
    if cost.size == 0:
        return [], list(range(cost.shape[0])), list(range(cost.shape[1]))
    bounded = np.where(cost > threshold, threshold + 1e4, cost)
    from scipy.optimize import linear_sum_assignment  # here: scipy costs ~40 MB, and tracking is optional

    rows, cols = linear_sum_assignment(bounded)
    matches = [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if cost[r, c] <= threshold]
    matched_rows = {r for r, _ in matches}
    matched_cols = {c for _, c in matches}
    return (matches, [r for r in range(cost.shape[0]) if r not in matched_rows],
            [c for c in range(cost.shape[1]) if c not in matched_cols])


@dataclass
class ByteTracker(FastTracker):
    """The product's :class:`~app.postprocess.bytetrack.ByteTracker` settings with the per-track state and steps
    below (the product's own state fields are inherited and left unused)."""

    _tracked: list[_Track] = field(default_factory=list)
    _lost: list[_Track] = field(default_factory=list)

    @property
    def max_time_lost(self) -> int:
        return max(int(self.frame_rate / 30.0 * self.lost_track_buffer), 1)

    def update(self, xyxy: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Advance one frame; the track id of each input row, -1 where no confirmed track took it."""
        self.frame_id += 1
        high = np.flatnonzero(scores > self.track_activation_threshold)
        low = np.flatnonzero((scores > self.low_score_threshold) & (scores <= self.track_activation_threshold))
        unconfirmed = [t for t in self._tracked if not t.is_activated]
        pool = [t for t in self._tracked if t.is_activated] + self._lost
        for track in pool:
            track.predict()

        # 1. high-score detections against confirmed and lost tracks
        cost = 1 - iou_matrix(self._boxes(pool), xyxy[high]) * scores[high][None, :]
        matches, unmatched_pool, unmatched_high = _match(cost, self.minimum_matching_threshold)
        for t, d in matches:
            pool[t].correct(xyxy[high[d]], float(scores[high[d]]), self.frame_id, int(high[d]))
        # 2. low-score detections against tracks that were tracked until now
        remaining = [pool[t] for t in unmatched_pool if pool[t].state is TrackState.TRACKED]
        matches, unmatched_remaining, _ = _match(1 - iou_matrix(self._boxes(remaining), xyxy[low]), 0.5)
        for t, d in matches:
            remaining[t].correct(xyxy[low[d]], float(scores[low[d]]), self.frame_id, int(low[d]))
        for t in unmatched_remaining:
            remaining[t].state = TrackState.LOST
        # 3. new tracks seen last frame get one chance at the leftover high-score detections
        left = high[unmatched_high]
        cost = 1 - iou_matrix(self._boxes(unconfirmed), xyxy[left]) * scores[left][None, :]
        matches, unmatched_new, unmatched_left = _match(cost, 0.7)
        for t, d in matches:
            unconfirmed[t].correct(xyxy[left[d]], float(scores[left[d]]), self.frame_id, int(left[d]))
        for t in unmatched_new:
            unconfirmed[t].state = TrackState.REMOVED
        started = [
            _Track.start(xyxy[row], float(scores[row]), self.frame_id, int(row))
            for row in left[unmatched_left]
            if scores[row] >= self.track_activation_threshold + 0.1
        ]
        self._retire(pool + unconfirmed + started)
        return self._ids_by_row(len(scores))

    def alive_ids(self) -> set[int]:
        """Ids of the tracks still held, tracked or lost (a lost one may yet be found again)."""
        return {t.track_id for t in self._tracked if t.track_id >= 0} | {t.track_id for t in self._lost
                                                                          if t.track_id >= 0}

    def _boxes(self, tracks: list[_Track]) -> np.ndarray:
        return np.array([t.xyxy for t in tracks]).reshape(-1, 4)

    def _retire(self, tracks: list[_Track]) -> None:
        for track in tracks:
            if track.state is TrackState.LOST and self.frame_id - track.frame_id > self.max_time_lost:
                track.state = TrackState.REMOVED
        tracked = [t for t in tracks if t.state is TrackState.TRACKED]
        lost = [t for t in tracks if t.state is TrackState.LOST]
        # A lost track overlapping a tracked one (IoU > 0.85) is the same object twice: keep the older.
        overlap = iou_matrix(self._boxes(tracked), self._boxes(lost)) > 0.85
        dropped_tracked, dropped_lost = set(), set()
        for t, lo in zip(*np.nonzero(overlap), strict=True):
            age_tracked = tracked[t].frame_id - tracked[t].start_frame
            age_lost = lost[lo].frame_id - lost[lo].start_frame
            if age_tracked > age_lost:
                dropped_lost.add(lo)
            else:
                dropped_tracked.add(t)
        self._tracked = [t for i, t in enumerate(tracked) if i not in dropped_tracked]
        self._lost = [t for i, t in enumerate(lost) if i not in dropped_lost]

    def _ids_by_row(self, rows: int) -> np.ndarray:
        ids = np.full(rows, -1, dtype=np.int64)
        for track in self._tracked:
            if track.is_activated and track.frame_id == self.frame_id:
                if track.track_id < 0:
                    track.track_id, self._next_id = self._next_id, self._next_id + 1
                ids[track.row] = track.track_id
        return ids
