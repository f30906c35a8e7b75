"""ByteTrack (Zhang et al., 2022): multi-object tracking by associating every detection box.

A compact re-implementation of the algorithm as ``supervision.ByteTrack``
had it (supervision 0.31, the version we pin, no longer ships a tracker):
a constant-velocity Kalman filter per track on ``(cx, cy, aspect, h)``; high
score detections are matched first to tracked and lost tracks (IoU fused with
the score), then low score detections to the tracks still unmatched, then new
tracks are confirmed by a second sighting. Lost tracks are kept for
``lost_track_buffer`` frames at 30 fps (scaled by the stream's frame rate).

Unlike supervision, :meth:`ByteTracker.update` reports which *input row*
each confirmed track was matched to, so callers keep every detection and never
have to re-match boxes by IoU. Each tracker owns its id counter (ids start at 1
per tracker); nothing is shared between trackers.

Cost. Zones and lines switch tracking on for their sources, so the tracker runs
on the postprocess thread for every frame of those streams and must stay a
small part of its budget. Hence the tracks are not objects but rows of
:class:`_Tracks`, a set of stacked arrays, and each step (predict, correct, box
conversion, retiring) is a few NumPy calls for all tracks at once. The Kalman
filter is written in closed form: the motion model ``F = I + shift`` couples
each coordinate only with its own velocity, and the process and measurement
noises are diagonal, so the 8×8 covariance is four independent 2×2 blocks
``[[var_pos, cov], [cov, var_vel]]`` and the 4×4 innovation covariance is
diagonal. That is the same filter as the dense matrix form, up to rounding.
Row order follows ByteTrack's track lists (tracked, then lost, then new), since
matching ties and the order in which new ids are given depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

import numpy as np

_STD_POSITION = 1.0 / 20
_STD_VELOCITY = 1.0 / 160
_HEIGHT_SCALED = np.array([True, True, False, True])  # cx, cy, h: noise ∝ height; aspect: fixed
_POS_NOISE = np.where(_HEIGHT_SCALED, 0.0, 1e-2)  # predict: fixed std of the position
_VEL_NOISE = np.where(_HEIGHT_SCALED, 0.0, 1e-5)  # predict: fixed std of the velocity
_MEASURE_NOISE = np.where(_HEIGHT_SCALED, 0.0, 1e-1)  # correct: fixed std of the measurement
_SCALE = _HEIGHT_SCALED.astype(np.float64)


class TrackState(Enum):
    NEW = 0
    TRACKED = 1
    LOST = 2
    REMOVED = 3


_TRACKED, _LOST, _REMOVED = TrackState.TRACKED.value, TrackState.LOST.value, TrackState.REMOVED.value


def _xyxy_to_xyah(xyxy: np.ndarray) -> np.ndarray:
    """``(n, 4)`` xyxy boxes as ``(n, 4)`` centre x, centre y, aspect (w / h), height."""
    width, height = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    return np.stack([xyxy[:, 0] + width / 2, xyxy[:, 1] + height / 2, width / np.maximum(height, 1e-6), height], 1)


def _xyah_to_xyxy(xyah: np.ndarray) -> np.ndarray:
    width, half_height = xyah[:, 2] * xyah[:, 3], xyah[:, 3] / 2
    return np.stack([xyah[:, 0] - width / 2, xyah[:, 1] - half_height,
                     xyah[:, 0] + width / 2, xyah[:, 1] + half_height], 1)


def _noise(height: np.ndarray, scale: float, fixed: np.ndarray) -> np.ndarray:
    """``(n, 4)`` variances: ``(scale × h)²`` for cx, cy, h and ``fixed²`` for the aspect."""
    return np.square(height[:, None] * (scale * _SCALE) + fixed)


@dataclass(slots=True)
class _Tracks:
    """Every held track as one row of each array; ``n`` rows.

    ``mean`` ``(n, 8)``: cx, cy, aspect, h, then their velocities (pixels per
    frame). ``var_pos``, ``cov``, ``var_vel`` ``(n, 4)``: per coordinate, its
    variance, its covariance with its velocity, and the velocity's variance.
    ``row`` is the input row the track matched in frame ``frame_id``.
    """

    mean: np.ndarray
    var_pos: np.ndarray
    cov: np.ndarray
    var_vel: np.ndarray
    score: np.ndarray
    start_frame: np.ndarray
    frame_id: np.ndarray
    row: np.ndarray
    state: np.ndarray
    activated: np.ndarray
    track_id: np.ndarray

    @classmethod
    def start(cls, xyxy: np.ndarray, scores: np.ndarray, frame_id: int, rows: np.ndarray) -> _Tracks:
        """New tracks, tracked from the given ``(n, 4)`` boxes; confirmed at once on the stream's first frame."""
        n = len(rows)
        measurement = _xyxy_to_xyah(xyxy)
        height = measurement[:, 3]
        ints = np.full(n, frame_id, np.int64)
        return cls(np.concatenate([measurement, np.zeros((n, 4))], 1),
                   _noise(height, 2 * _STD_POSITION, _POS_NOISE), np.zeros((n, 4)),
                   _noise(height, 10 * _STD_VELOCITY, _VEL_NOISE), scores.astype(np.float64), ints, ints.copy(),
                   rows.astype(np.int64), np.full(n, _TRACKED, np.int8), np.full(n, frame_id == 1),
                   np.full(n, -1, np.int64))

    @classmethod
    def empty(cls) -> _Tracks:
        return cls.start(np.zeros((0, 4)), np.zeros(0), 0, np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.score)

    def take(self, index: np.ndarray) -> _Tracks:
        return _Tracks(*(getattr(self, f.name)[index] for f in fields(self)))

    def append(self, other: _Tracks) -> _Tracks:
        if len(other) == 0:
            return self
        return _Tracks(*(np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)))

    def boxes(self) -> np.ndarray:
        """``(n, 4)`` xyxy box of each track's current mean."""
        return _xyah_to_xyxy(self.mean[:, :4])

    def predict(self, stop: int) -> None:
        """Kalman predict, in place, for rows ``[0, stop)``; a track not tracked stops growing or shrinking."""
        mean, var_pos, cov, var_vel = self.mean[:stop], self.var_pos[:stop], self.cov[:stop], self.var_vel[:stop]
        mean[self.state[:stop] != _TRACKED, 7] = 0.0
        height = mean[:, 3].copy()
        mean[:, :4] += mean[:, 4:]
        var_pos[:] = (var_pos + cov) + (cov + var_vel) + _noise(height, _STD_POSITION, _POS_NOISE)
        cov += var_vel
        var_vel += _noise(height, _STD_VELOCITY, _VEL_NOISE)

    def correct(self, index: np.ndarray, xyxy: np.ndarray, scores: np.ndarray, frame_id: int,
                rows: np.ndarray) -> None:
        """Kalman update of rows ``index`` with their matched boxes; they are (again) tracked and confirmed."""
        if len(index) == 0:
            return
        mean, var_pos, cov, var_vel = self.mean[index], self.var_pos[index], self.cov[index], self.var_vel[index]
        innovation_var = var_pos + _noise(mean[:, 3], _STD_POSITION, _MEASURE_NOISE)
        gain_pos, gain_vel = var_pos / innovation_var, cov / innovation_var
        innovation = _xyxy_to_xyah(xyxy) - mean[:, :4]
        mean[:, :4] += gain_pos * innovation
        mean[:, 4:] += gain_vel * innovation
        self.mean[index] = mean
        self.var_pos[index] = var_pos - gain_pos * var_pos
        self.cov[index] = cov - gain_pos * cov
        self.var_vel[index] = var_vel - gain_vel * cov
        self.score[index], self.frame_id[index], self.row[index] = scores, frame_id, rows
        self.state[index], self.activated[index] = _TRACKED, True


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


def _match(cost: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Minimum-cost assignment where no pair costs more than ``threshold``.

    Returns matched rows and columns (rows ascending), then unmatched rows and
    columns. When every row and every column has at most one pair within the
    threshold, those pairs are the only optimum, so the solver is skipped.
    """
    feasible = cost <= threshold
    if cost.size == 0 or (feasible.sum(0).max() <= 1 and feasible.sum(1).max() <= 1):
        rows, cols = np.nonzero(feasible)
    else:
        from scipy.optimize import linear_sum_assignment  # here: scipy costs ~40 MB, and tracking is optional

        rows, cols = linear_sum_assignment(np.where(feasible, cost, threshold + 1e4))
        keep = feasible[rows, cols]
        rows, cols = rows[keep], cols[keep]
    unmatched_rows, unmatched_cols = np.ones(cost.shape[0], bool), np.ones(cost.shape[1], bool)
    unmatched_rows[rows] = False
    unmatched_cols[cols] = False
    return rows, cols, np.flatnonzero(unmatched_rows), np.flatnonzero(unmatched_cols)


@dataclass
class ByteTracker:
    """ByteTrack for one stream. Runs on thread ``detstream.postprocess``; not thread-safe.

    ``track_activation_threshold``: detections above it can start tracks and are
    matched first (raise it to avoid tracks on false positives; lower it to
    track faint objects). ``lost_track_buffer``: frames (at 30 fps) a lost track
    waits to be found again (longer survives occlusions, but risks id swaps).
    ``minimum_matching_threshold``: largest fused ``1 - IoU×score`` cost that
    still matches (higher matches more, more loosely). ``frame_rate`` scales
    the buffer to the stream.
    """

    track_activation_threshold: float = 0.25
    lost_track_buffer: int = 30
    minimum_matching_threshold: float = 0.8
    frame_rate: float = 30.0
    low_score_threshold: float = 0.1
    frame_id: int = 0
    # Confirmed tracked tracks, then lost ones (together: the pool matched first), then unconfirmed ones.
    _tracks: _Tracks = field(default_factory=_Tracks.empty)
    _pool_size: int = 0
    _next_id: int = 1

    @property
    def max_time_lost(self) -> int:
        return max(int(self.frame_rate / 30.0 * self.lost_track_buffer), 1)

    def update(self, xyxy: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Advance one frame; the track id of each input row, -1 where no confirmed track took it."""
        self.frame_id += 1
        tracks, pool = self._tracks, self._pool_size
        high = np.flatnonzero(scores > self.track_activation_threshold)
        low = np.flatnonzero((scores > self.low_score_threshold) & (scores <= self.track_activation_threshold))
        tracks.predict(pool)
        boxes = tracks.boxes()
        was_tracked = tracks.state == _TRACKED

        # 1. high-score detections against confirmed and lost tracks
        cost = 1 - iou_matrix(boxes[:pool], xyxy[high]) * scores[high][None, :]
        t, d, unmatched_pool, unmatched_high = _match(cost, self.minimum_matching_threshold)
        self._correct(t, high[d], xyxy, scores)
        # 2. low-score detections against tracks that were tracked until now
        remaining = unmatched_pool[was_tracked[unmatched_pool]]
        t, d, unmatched_remaining, _ = _match(1 - iou_matrix(boxes[remaining], xyxy[low]), 0.5)
        self._correct(remaining[t], low[d], xyxy, scores)
        tracks.state[remaining[unmatched_remaining]] = _LOST
        # 3. new tracks seen last frame get one chance at the leftover high-score detections
        left = high[unmatched_high]
        cost = 1 - iou_matrix(boxes[pool:], xyxy[left]) * scores[left][None, :]
        t, d, unmatched_new, unmatched_left = _match(cost, 0.7)
        self._correct(pool + t, left[d], xyxy, scores)
        tracks.state[pool + unmatched_new] = _REMOVED
        started = left[unmatched_left]
        started = started[scores[started] >= self.track_activation_threshold + 0.1]
        tracks = tracks.append(_Tracks.start(xyxy[started], scores[started], self.frame_id, started))
        self._retire(tracks)
        ids = self._ids_by_row(tracks, len(scores))
        self._keep(tracks)
        return ids

    def alive_ids(self) -> set[int]:
        """Ids of the tracks still held, tracked or lost (a lost one may yet be found again)."""
        ids = self._tracks.track_id
        return set(ids[ids >= 0].tolist())

    def _correct(self, index: np.ndarray, rows: np.ndarray, xyxy: np.ndarray, scores: np.ndarray) -> None:
        self._tracks.correct(index, xyxy[rows], scores[rows], self.frame_id, rows)

    def _retire(self, tracks: _Tracks) -> None:
        """Removes, in place, tracks lost too long and the younger of a tracked and a lost track that overlap."""
        lost = tracks.state == _LOST
        tracks.state[lost & (self.frame_id - tracks.frame_id > self.max_time_lost)] = _REMOVED
        lost, tracked = tracks.state == _LOST, tracks.state == _TRACKED
        if not lost.any() or not tracked.any():
            return
        lost, tracked = np.flatnonzero(lost), np.flatnonzero(tracked)
        boxes = tracks.boxes()
        # A lost track overlapping a tracked one (IoU > 0.85) is the same object twice: keep the older.
        overlap = iou_matrix(boxes[tracked], boxes[lost]) > 0.85
        if not overlap.any():
            return
        age = tracks.frame_id - tracks.start_frame
        tracked_older = age[tracked][:, None] > age[lost][None, :]
        tracks.state[tracked[(overlap & ~tracked_older).any(1)]] = _REMOVED
        tracks.state[lost[(overlap & tracked_older).any(0)]] = _REMOVED

    def _ids_by_row(self, tracks: _Tracks, rows: int) -> np.ndarray:
        """Ids of the rows matched this frame by confirmed tracks; new ids go out in track-list order."""
        matched = np.flatnonzero((tracks.state == _TRACKED) & tracks.activated & (tracks.frame_id == self.frame_id))
        new = matched[tracks.track_id[matched] < 0]
        tracks.track_id[new] = np.arange(self._next_id, self._next_id + len(new))
        self._next_id += len(new)
        ids = np.full(rows, -1, dtype=np.int64)
        ids[tracks.row[matched]] = tracks.track_id[matched]
        return ids

    def _keep(self, tracks: _Tracks) -> None:
        """Holds the tracks not removed, reordered for the next frame: confirmed tracked, lost, unconfirmed."""
        tracked = tracks.state == _TRACKED
        order = np.concatenate([np.flatnonzero(tracked & tracks.activated), np.flatnonzero(tracks.state == _LOST),
                                np.flatnonzero(tracked & ~tracks.activated)])
        self._tracks = tracks.take(order)
        self._pool_size = len(order) - int((tracked & ~tracks.activated).sum())
