"""Optional per-stream tracking: fills ``Detections.track_ids`` with ByteTrack ids.

Runs on thread ``detstream.postprocess``, which owns the :class:`StreamTrackers`.
Each stream has its own :class:`~app.postprocess.bytetrack.ByteTracker` (own
id counter), created on the stream's first frame and forgotten by
:meth:`StreamTrackers.reset` when the stream reconnects or ends, since
positions from before a gap would only cause wrong matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.postprocess.bytetrack import ByteTracker
from app.types import Detections


@dataclass(frozen=True, slots=True)
class TrackerSettings:
    """ByteTrack tunables shared by every stream; see :class:`ByteTracker` for the trade-offs."""

    track_activation_threshold: float = 0.25
    lost_track_buffer: int = 30
    minimum_matching_threshold: float = 0.8


class StreamTrackers:
    """One ByteTrack tracker per ``stream_id``. Not thread-safe: one owner thread."""

    def __init__(self, settings: TrackerSettings | None = None) -> None:
        self._settings = settings or TrackerSettings()
        self._trackers: dict[str, ByteTracker] = {}

    def update(self, stream_id: str, detections: Detections, frame_rate: float | None = None) -> Detections:
        """A new :class:`Detections` with every input row and ``track_ids`` filled where a confirmed track matched.

        Rows no track took (low scores, a first sighting not yet confirmed)
        keep ``track_id == -1``. The input is not modified. ``frame_rate``
        (frames per second of the stream, None or 0 when unknown: 30 is
        assumed) sizes how long a lost track is remembered.
        """
        tracker = self._trackers.get(stream_id)
        if tracker is None:
            fps = frame_rate if frame_rate and frame_rate > 0 else 30.0
            s = self._settings
            tracker = ByteTracker(s.track_activation_threshold, s.lost_track_buffer, s.minimum_matching_threshold, fps)
            self._trackers[stream_id] = tracker
        track_ids = tracker.update(detections.xyxy.astype("float64"), detections.scores.astype("float64"))
        return Detections(detections.xyxy.copy(), detections.scores.copy(), detections.class_ids.copy(), track_ids)

    def alive(self, stream_id: str) -> set[int]:
        """Ids the stream's tracker still holds, tracked or lost; a track not among them is gone for good."""
        tracker = self._trackers.get(stream_id)
        return set() if tracker is None else tracker.alive_ids()

    def reset(self, stream_id: str) -> None:
        """Forget the stream's tracks (reconnect or end); its next frame starts ids from 1 again."""
        self._trackers.pop(stream_id, None)

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self._trackers

    def __len__(self) -> int:
        return len(self._trackers)
