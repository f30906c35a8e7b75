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
small part of that thread's budget. Hence tracks are not objects but rows of
two arrays (:class:`_Tracks`), and each step is a few NumPy calls for all
tracks at once. The Kalman filter needs no 8×8 matrices: ``F = [[I, I], [0, I]]``
couples each coordinate only with its own velocity and every noise is
diagonal, so the covariance is four independent 2×2 blocks ``[[var_pos, cov],
[cov, var_vel]]`` and the innovation covariance is diagonal; predict is one
product with a 20×20 transition matrix and correct is element-wise. That is
the dense filter up to rounding. The assignment solver runs only when some
track or detection has two candidates within the threshold. Rows keep
ByteTrack's list order (confirmed tracked, lost, unconfirmed), since matching
ties and the order in which new ids are given depend on it;
``tests/unit/postprocess/test_bytetrack_equivalence.py`` checks the ids against
a per-track implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

_STD_POSITION = 1.0 / 20
_STD_VELOCITY = 1.0 / 160
# Columns of _Tracks.kalman and _Tracks.info.
_MEAN, _VAR_POS, _COV, _VAR_VEL = slice(0, 8), slice(8, 12), slice(12, 16), slice(16, 20)
_START, _FRAME, _ROW, _STATE, _ACTIVATED, _ID = range(6)
# Noise std of (cx, cy, aspect, h) is ``scale × h + fixed``: fixed for the aspect, proportional to h for the others.
# The 12-wide pairs give the variances of columns 8:20 (position, 0 for the covariances, velocity).
_H, _A = np.array([1.0, 1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
_START_SCALE = np.concatenate([2 * _STD_POSITION * _H, 0 * _H, 10 * _STD_VELOCITY * _H])
_START_FIXED = np.concatenate([1e-2 * _A, 0 * _A, 1e-5 * _A])
_PREDICT_SCALE = np.concatenate([_STD_POSITION * _H, 0 * _H, _STD_VELOCITY * _H])
_PREDICT_FIXED = _START_FIXED
_MEASURE_SCALE, _MEASURE_FIXED = _STD_POSITION * _H, 1e-1 * _A


def _transition() -> np.ndarray:
    """``kalman @ _TRANSITION`` predicts the mean with ``F = [[I, I], [0, I]]`` and each 2×2 block of ``F P Fᵀ``.

    Position += velocity; var_pos += 2 cov + var_vel; cov += var_vel; var_vel stays (noise is added after).
    """
    transition, eye = np.eye(20), np.eye(4)
    transition[4:8, 0:4] = eye
    transition[_COV, _VAR_POS], transition[_VAR_VEL, _VAR_POS], transition[_VAR_VEL, _COV] = 2 * eye, eye, eye
    return transition


_TRANSITION = _transition()
_TWICE = np.r_[0:4, 0:4]
# Correct: columns 8:20 lose gain × (var_pos, cov, cov), with the position gain, position gain, velocity gain.
_GAIN_OF, _REDUCED_BY = np.r_[0:4, 0:4, 4:8], np.r_[_VAR_POS, _COV, _COV]


class TrackState(Enum):
    NEW = 0
    TRACKED = 1
    LOST = 2
    REMOVED = 3


_TRACKED, _LOST, _REMOVED = TrackState.TRACKED.value, TrackState.LOST.value, TrackState.REMOVED.value


def _xyxy_to_xyah(xyxy: np.ndarray) -> np.ndarray:
    """``(n, 4)`` xyxy boxes as ``(n, 4)`` centre x, centre y, aspect (w / h), height."""
    wh = xyxy[:, 2:] - xyxy[:, :2]
    xyah = np.empty((len(xyxy), 4))
    xyah[:, :2] = xyxy[:, :2] + wh / 2
    xyah[:, 2] = wh[:, 0] / np.maximum(wh[:, 1], 1e-6)
    xyah[:, 3] = wh[:, 1]
    return xyah


def _xyah_to_xyxy(xyah: np.ndarray) -> np.ndarray:
    half = xyah[:, 2:4].copy()
    half[:, 0] *= half[:, 1]
    half /= 2
    return np.concatenate([xyah[:, :2] - half, xyah[:, :2] + half], 1)


def _noise(height: np.ndarray, scale: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Variances ``(scale × h + fixed)²``, one row per height."""
    return np.square(height[:, None] * scale + fixed)


@dataclass(slots=True)
class _Tracks:
    """Every held track as one row of two arrays.

    ``kalman`` ``(n, 20)`` float64: the mean (cx, cy, aspect, h, then their
    velocities in pixels per frame), then per coordinate its variance, its
    covariance with its velocity, and the velocity's variance (columns
    ``_MEAN``, ``_VAR_POS``, ``_COV``, ``_VAR_VEL``). ``info`` ``(n, 6)``
    int64: start frame, last matched frame, the input row matched in that
    frame, :class:`TrackState` value, confirmed (0/1), id (-1 until confirmed).
    """

    kalman: np.ndarray
    info: np.ndarray

    @classmethod
    def start(cls, xyxy: np.ndarray, frame_id: int, rows: np.ndarray) -> _Tracks:
        """New tracks, tracked from the given ``(n, 4)`` boxes; confirmed at once on the stream's first frame."""
        kalman = np.zeros((len(rows), 20))
        kalman[:, :4] = _xyxy_to_xyah(xyxy)
        kalman[:, 8:] = _noise(kalman[:, 3], _START_SCALE, _START_FIXED)
        info = np.empty((len(rows), 6), np.int64)
        info[:] = frame_id, frame_id, 0, _TRACKED, frame_id == 1, -1
        info[:, _ROW] = rows
        return cls(kalman, info)

    def __len__(self) -> int:
        return len(self.info)

    def take(self, index: np.ndarray) -> _Tracks:
        return _Tracks(self.kalman.take(index, 0), self.info.take(index, 0))

    def append(self, other: _Tracks) -> _Tracks:
        return _Tracks(np.concatenate([self.kalman, other.kalman]), np.concatenate([self.info, other.info]))

    def boxes(self) -> np.ndarray:
        """``(n, 4)`` xyxy box of each track's current mean."""
        return _xyah_to_xyxy(self.kalman)

    def predict(self, stop: int) -> None:
        """Kalman predict, in place, for rows ``[0, stop)``; a track not tracked stops growing or shrinking."""
        kalman = self.kalman[:stop]
        kalman[self.info[:stop, _STATE] != _TRACKED, 7] = 0.0
        noise = _noise(kalman[:, 3], _PREDICT_SCALE, _PREDICT_FIXED)
        kalman[:] = kalman @ _TRANSITION
        kalman[:, 8:] += noise

    def correct(self, index: np.ndarray, xyxy: np.ndarray, frame_id: int, rows: np.ndarray) -> None:
        """Kalman update of rows ``index`` with their matched boxes; they are (again) tracked and confirmed."""
        kalman = self.kalman.take(index, 0)
        innovation_var = kalman[:, _VAR_POS] + _noise(kalman[:, 3], _MEASURE_SCALE, _MEASURE_FIXED)
        gain = kalman[:, 8:16] / innovation_var.take(_TWICE, 1)  # of the positions, then of the velocities
        kalman[:, _MEAN] += gain * (_xyxy_to_xyah(xyxy) - kalman[:, :4]).take(_TWICE, 1)
        kalman[:, 8:] -= gain.take(_GAIN_OF, 1) * kalman.take(_REDUCED_BY, 1)
        self.kalman[index] = kalman
        self.info[index, _FRAME:_ID] = frame_id, 0, _TRACKED, 1
        self.info[index, _ROW] = rows


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``(n, 4)`` and ``(m, 4)`` xyxy boxes, ``(n, m)``."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    overlap = np.minimum(a[:, None, 2:], b[None, :, 2:]) - np.maximum(a[:, None, :2], b[None, :, :2])
    np.maximum(overlap, 0, out=overlap)
    inter = overlap[..., 0] * overlap[..., 1]
    size_a, size_b = np.maximum(a[:, 2:] - a[:, :2], 0), np.maximum(b[:, 2:] - b[:, :2], 0)
    union = (size_a[:, 0] * size_a[:, 1])[:, None] + size_b[:, 0] * size_b[:, 1] - inter
    return np.divide(inter, union, out=np.zeros(inter.shape), where=union > 0)


def _match(cost: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Minimum-cost assignment where no pair costs more than ``threshold``.

    Returns matched rows and columns (rows ascending), then unmatched rows and
    columns. When no row and no column has two pairs within the threshold,
    those pairs are the only optimum (any other assignment swaps one of them for
    an over-threshold pair), so the solver is skipped.
    """
    (n, m), feasible = cost.shape, cost <= threshold
    rows, cols = feasible.nonzero()
    free_rows, free_cols = np.ones(n, bool), np.ones(m, bool)
    free_rows[rows], free_cols[cols] = False, False
    if len(rows) > n - np.count_nonzero(free_rows) or len(cols) > m - np.count_nonzero(free_cols):
        from scipy.optimize import linear_sum_assignment  # loaded by ByteTracker.__post_init__

        rows, cols = linear_sum_assignment(np.where(feasible, cost, threshold + 1e4))
        keep = feasible[rows, cols]
        rows, cols = rows[keep], cols[keep]
        free_rows[:], free_cols[:] = True, True
        free_rows[rows], free_cols[cols] = False, False
    return rows, cols, free_rows.nonzero()[0], free_cols.nonzero()[0]


# Where _Tracks rows go for the next frame, by (state, confirmed): confirmed tracked, lost, unconfirmed; -1: dropped.
_RANK = np.array([[-1, -1], [2, 0], [1, 1], [-1, -1]])


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
    # Rows in ByteTrack's list order: confirmed tracked tracks, then lost ones (together the
    # first _pool_size rows, matched first), then unconfirmed ones.
    _tracks: _Tracks = field(default_factory=lambda: _Tracks.start(np.zeros((0, 4)), 0, np.zeros(0, np.int64)))
    _pool_size: int = 0
    _next_id: int = 1

    def __post_init__(self) -> None:
        # scipy (~40 MB, a fraction of a second) is loaded when a stream gets a tracker, not on the first
        # ambiguous match in the middle of a stream, where it would stall the postprocess thread.
        import scipy.optimize  # noqa: F401

    @property
    def max_time_lost(self) -> int:
        return max(int(self.frame_rate / 30.0 * self.lost_track_buffer), 1)

    def update(self, xyxy: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Advance one frame; the track id of each input row, -1 where no confirmed track took it."""
        self.frame_id += 1
        tracks, pool = self._tracks, self._pool_size
        high = (scores > self.track_activation_threshold).nonzero()[0]
        low = ((scores > self.low_score_threshold) & (scores <= self.track_activation_threshold)).nonzero()[0]
        tracks.predict(pool)
        boxes = tracks.boxes()
        was_tracked = tracks.info[:, _STATE] == _TRACKED

        # 1. high-score detections against confirmed and lost tracks
        cost = 1 - iou_matrix(boxes[:pool], xyxy[high]) * scores[high]
        t, d, unmatched_pool, unmatched_high = _match(cost, self.minimum_matching_threshold)
        self._correct(t, high[d], xyxy)
        # 2. low-score detections against tracks that were tracked until now
        remaining = unmatched_pool[was_tracked[unmatched_pool]]
        if len(remaining):
            t, d, unmatched_remaining, _ = _match(1 - iou_matrix(boxes[remaining], xyxy[low]), 0.5)
            self._correct(remaining[t], low[d], xyxy)
            tracks.info[remaining[unmatched_remaining], _STATE] = _LOST
        # 3. new tracks seen last frame get one chance at the leftover high-score detections
        left = high[unmatched_high]
        if len(tracks) > pool:
            cost = 1 - iou_matrix(boxes[pool:], xyxy[left]) * scores[left]
            t, d, unmatched_new, left_index = _match(cost, 0.7)
            self._correct(pool + t, left[d], xyxy)
            tracks.info[pool + unmatched_new, _STATE] = _REMOVED
            left = left[left_index]
        started = left[scores[left] >= self.track_activation_threshold + 0.1]
        if len(started):
            tracks = tracks.append(_Tracks.start(xyxy[started], self.frame_id, started))
        self._retire(tracks)
        ids = self._ids_by_row(tracks.info, len(scores))
        self._keep(tracks)
        return ids

    def alive_ids(self) -> set[int]:
        """Ids of the tracks still held, tracked or lost (a lost one may yet be found again)."""
        ids = self._tracks.info[:, _ID]
        return set(ids[ids >= 0].tolist())

    def _correct(self, index: np.ndarray, rows: np.ndarray, xyxy: np.ndarray) -> None:
        if len(index):
            self._tracks.correct(index, xyxy[rows], self.frame_id, rows)

    def _retire(self, tracks: _Tracks) -> None:
        """Marks removed, in place, tracks lost too long and the younger of a tracked and a lost one that overlap."""
        info = tracks.info
        lost = info[:, _STATE] == _LOST
        if not lost.any():
            return
        info[lost & (self.frame_id - info[:, _FRAME] > self.max_time_lost), _STATE] = _REMOVED
        lost, tracked = (info[:, _STATE] == _LOST).nonzero()[0], (info[:, _STATE] == _TRACKED).nonzero()[0]
        if not len(lost) or not len(tracked):
            return
        boxes = tracks.boxes()
        # A lost track overlapping a tracked one (IoU > 0.85) is the same object twice: keep the older.
        overlap = iou_matrix(boxes[tracked], boxes[lost]) > 0.85
        if not overlap.any():
            return
        age = info[:, _FRAME] - info[:, _START]
        tracked_older = age[tracked][:, None] > age[lost][None, :]
        info[tracked[(overlap & ~tracked_older).any(1)], _STATE] = _REMOVED
        info[lost[(overlap & tracked_older).any(0)], _STATE] = _REMOVED

    def _ids_by_row(self, info: np.ndarray, rows: int) -> np.ndarray:
        """Ids of the rows matched this frame by confirmed tracks; new ids go out in track-list order."""
        matched = ((info[:, _FRAME] == self.frame_id) & (info[:, _STATE] == _TRACKED)
                   & (info[:, _ACTIVATED] == 1)).nonzero()[0]
        new = matched[info[matched, _ID] < 0]
        if len(new):
            info[new, _ID] = np.arange(self._next_id, self._next_id + len(new))
            self._next_id += len(new)
        ids = np.full(rows, -1, dtype=np.int64)
        ids[info[matched, _ROW]] = info[matched, _ID]
        return ids

    def _keep(self, tracks: _Tracks) -> None:
        """Holds the tracks not removed, in the next frame's order: confirmed tracked, lost, unconfirmed."""
        rank = _RANK[tracks.info[:, _STATE], tracks.info[:, _ACTIVATED]]
        if len(rank) and (rank[0] < 0 or (rank[1:] < rank[:-1]).any()):
            order = rank.argsort(kind="stable")
            order = order[rank[order] >= 0]
            tracks, rank = tracks.take(order), rank[order]
        self._tracks, self._pool_size = tracks, int(np.count_nonzero(rank < 2))
