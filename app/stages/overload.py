"""Saying so when live cameras offer more frames than the engine runs.

The live policy drops frames on purpose: a camera over its quota, or a frame
older than ``max_staleness_ms``. Each drop is counted (``dropped_before``, the
``dropped`` status field, ``detstream_frames_dropped_total{reason="live_policy"}``),
but a count does not tell an operator why, or what to change; this warning
does, in the worker's own log. The postprocess thread feeds
:class:`DropReport` every published live frame; once drops have gone on for
``settle_s``, one WARNING gives the drops per stream, the rate the cameras
offered and the rate the engine kept up, its batches' time from submit to
result, what a frame cost in inference CPU where the engine measures it (a
cost that rises over the hours says the host got slower, not the cameras
more), and the three ways out. Then at most one line per
``interval_s``, so a worker that stays overloaded does not flood its log.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable

SETTLE_S = 10.0
"""Drops accumulate this long before the first report: a start-up burst alone is not an overload."""
INTERVAL_S = 60.0
"""At most one report per this many seconds."""
MAX_STREAMS_NAMED = 8


class DropReport:
    """Drops and publishes between reports, per stream; :meth:`due` returns the report's text when one is due.

    Runs on the postprocess thread only (not thread-safe). ``clock`` is ``time.monotonic`` (tests pass their own).
    """

    def __init__(self, backend: str, settle_s: float | None = None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backend = backend
        self._settle_s = SETTLE_S if settle_s is None else settle_s
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._clock = clock
        self._window_start: float | None = None  # first publish of the window
        self._first_drop_at: float | None = None
        self._last_report_at: float | None = None
        self._dropped: Counter[str] = Counter()
        self._published = 0
        self._infer_ms: list[float] = []
        self._cpu_ms: list[float] = []

    def published(self, stream_id: str, dropped_before: int, infer_ms: float, cpu_ms: float | None = None) -> None:
        """One published frame of ``stream_id``, after ``dropped_before`` frames of it were dropped;
        ``cpu_ms``: its share of its batch's inference CPU, when the engine measures it."""
        now = self._clock()
        if self._window_start is None:
            self._window_start = now
        self._published += 1
        if len(self._infer_ms) < 4096:
            self._infer_ms.append(infer_ms)
            if cpu_ms is not None:
                self._cpu_ms.append(cpu_ms)
        if dropped_before > 0:
            self._dropped[stream_id] += dropped_before
            if self._first_drop_at is None:
                self._first_drop_at = now

    def due(self) -> str | None:
        """The report's text when drops have lasted ``settle_s`` and no report came in ``interval_s``; else None.

        A window without drops is forgotten after ``interval_s``, so the rate in a report is that of the
        overloaded stretch, not of the quiet hour before it.
        """
        now = self._clock()
        if self._window_start is None:
            return None
        if self._first_drop_at is None:
            if now - self._window_start >= self._interval_s:
                self._reset(now)
            return None
        if now - self._first_drop_at < self._settle_s:
            return None
        if self._last_report_at is not None and now - self._last_report_at < self._interval_s:
            return None
        text = self._text(now - self._window_start)
        self._last_report_at = now
        self._reset(now)
        return text

    def _text(self, seconds: float) -> str:
        total = sum(self._dropped.values())
        ranked = self._dropped.most_common()
        named = ", ".join(f"{stream} {count}" for stream, count in ranked[:MAX_STREAMS_NAMED])
        if len(ranked) > MAX_STREAMS_NAMED:
            named += f", and {len(ranked) - MAX_STREAMS_NAMED} more streams"
        rate = self._published / seconds if seconds > 0 else 0.0
        offered = (self._published + total) / seconds if seconds > 0 else 0.0
        infer = statistics.median(self._infer_ms) if self._infer_ms else 0.0
        cpu = f", a frame {statistics.median(self._cpu_ms):.0f} ms of inference CPU" if self._cpu_ms else ""
        return (f"live sources dropped {total} frames in {seconds:.0f} s ({named}): the cameras offer more frames "
                f"than the engine runs. They offered {offered:.1f} frames/s. It published {rate:.1f} frames/s on "
                f"{self._backend}, a batch taking a median {infer:.0f} ms from submit to result{cpu}. "
                "To stop the drops: lower the sources' max_fps, "
                "move cameras to another worker, or use a faster model (on a CPU: --model yolov3-tiny-int8). "
                'Drops are counted in detstream_frames_dropped_total{reason="live_policy"}.')

    def _reset(self, now: float) -> None:
        self._window_start = now
        self._first_drop_at = None
        self._dropped.clear()
        self._published = 0
        self._infer_ms.clear()
        self._cpu_ms.clear()
