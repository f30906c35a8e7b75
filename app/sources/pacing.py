"""Frame-rate control on the decoder thread: decimation (``max_fps``) and realtime pacing.

Both are time based, not "keep every n-th frame", so they hold for variable
frame rates and for streams whose nominal rate is wrong. Files use the frame's
presentation time (pts); live sources use arrival time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]
Sleep = Callable[[float], bool]  # returns True when woken early to stop (threading.Event.wait)


class Decimator:
    """Admit at most ``max_fps`` frames per second of stream time.

    Admission slots sit on a grid ``1/max_fps`` apart; a frame is admitted
    when it reaches the next grid point (or is closer to it than the following
    frame will be: within half the recent inter-frame gap), and the grid then
    advances one interval. So the long-run rate never exceeds ``max_fps``,
    arrival jitter does not halve a stream that already runs at ``max_fps``,
    and after a gap (or a jump back, as at a loop restart) the grid restarts.

    >>> d = Decimator(5.0)
    >>> [d.admit(i / 10) for i in range(6)]  # a 10 fps clip halved
    [True, False, True, False, True, False]
    """

    def __init__(self, max_fps: float | None) -> None:
        self.interval_s = 1.0 / max_fps if max_fps else 0.0
        self._next: float | None = None
        self._last: float | None = None
        self._frame_gap_s = 0.0

    def admit(self, t_s: float | None) -> bool:
        """Whether the frame at time ``t_s`` (pts or arrival) goes on; None (no time) always does."""
        if not self.interval_s or t_s is None:
            return True
        self._observe_gap(t_s)
        if self._next is None or t_s < self._next - 2 * self.interval_s:
            self._next = t_s  # first frame, or time jumped back (loop restart, pts reset)
        if t_s < self._next - 0.5 * min(self._frame_gap_s, self.interval_s):
            return False
        behind = t_s - self._next >= self.interval_s
        self._next = (t_s if behind else self._next) + self.interval_s
        return True

    def _observe_gap(self, t_s: float) -> None:
        if self._last is not None and 0 < t_s - self._last < 10 * self.interval_s:
            gap = t_s - self._last
            self._frame_gap_s = gap if not self._frame_gap_s else 0.8 * self._frame_gap_s + 0.2 * gap
        self._last = t_s

    def reset(self) -> None:
        self._next = None
        self._last = None
        self._frame_gap_s = 0.0


class RealtimePacer:
    """Hold frames back until their pts-relative wall time, like a camera would deliver them.

    Anchors at the first frame (``wall = anchor_wall + pts - anchor_pts``).
    When pts jumps back (a loop restart) or forward by more than ``max_gap_s``
    (a timestamp discontinuity must not freeze the source for hours), the
    cadence goes on: the frame after the jump is due one frame interval (the
    last pts step seen) after the frame before it, as a camera's next frame
    would be (anchoring it at "now" would deliver two frames back to back at
    every loop restart, and looping cameras would burst in step). Re-anchors
    at "now" when the decoder is more than ``max_lag_s`` late (a slow consumer
    should not cause a burst to catch up).
    """

    def __init__(self, clock: Clock = time.monotonic, max_lag_s: float = 1.0, max_gap_s: float = 5.0) -> None:
        self._clock = clock
        self._max_lag_s = max_lag_s
        self._max_gap_s = max_gap_s
        self._anchor: tuple[float, float] | None = None  # (pts_s, wall_s)
        self._last_pts: float | None = None
        self._last_due: float | None = None  # wall time the previous frame was due
        self._step_s = 0.0  # the last pts step between two frames (the frame interval)

    def wait(self, pts_s: float | None, sleep: Sleep) -> bool:
        """Sleep until the frame is due; False when ``sleep`` was interrupted (stop requested)."""
        if pts_s is None:
            return True
        now = self._clock()
        step = None if self._last_pts is None else pts_s - self._last_pts
        if step is not None and 0 < step <= self._max_gap_s:
            self._step_s = step
        jumped = step is not None and not 0 <= step <= self._max_gap_s
        if self._anchor is None or jumped:  # first frame now; after a restart or a jump, keep the cadence
            self._anchor = (pts_s, now if self._last_due is None else self._last_due + self._step_s)
        self._last_pts = pts_s
        due = self._anchor[1] + (pts_s - self._anchor[0])
        if now - due > self._max_lag_s:
            self._anchor = (pts_s, now)
            self._last_due = now
            return True
        self._last_due = due
        if due > now:
            return not sleep(due - now)
        return True

    def reset(self) -> None:
        """A new pass over the file (loop restart): its first frame follows the last one at the frame interval."""
        self._anchor = None
        self._last_pts = None
