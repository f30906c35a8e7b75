"""Annotated H.264 MP4 per source plus a few JPEG snapshots, off the hot path.

Runs on thread ``detstream.annotate``; the postprocess thread only enqueues
(frame, detections). File sources enqueue with backpressure so the video has
every frame; live sources drop (and count) rather than slow inference.

The sink is optional, so it never holds the pipeline. When writing fails (a
full disk, a vanished directory, an encoder error) it stops for the rest of
the run: one WARNING names it and the error, :attr:`AnnotateSink.failure`
says so (``/healthz`` and the run summary show it), the files it had open are
closed (the MP4 index written if the disk lets it), and every later frame,
queued or submitted, is counted in ``dropped`` and discarded at once. The
backpressure for file sources waits only while the sink is healthy.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

from app.analytics.overlay import draw_analytics
from app.errors import ConfigError
from app.publish.base import ResultSink
from app.threads import StageThread
from app.types import FrameResult

logger = logging.getLogger(__name__)

_MS = Fraction(1, 1000)  # output timestamps are the source's own, in milliseconds
_PUT_POLL_S = 0.1  # how often a waiting lossless submit looks whether the sink has failed meanwhile

_PALETTE = np.array([(56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207),
                     (10, 249, 72), (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0)], np.uint8)


def draw_detections(image: np.ndarray, result: FrameResult, class_names: tuple[str, ...]) -> np.ndarray:
    """Boxes, labels and scores drawn onto a copy of ``image`` (BGR)."""
    canvas = image.copy()
    if result.analytics is not None:
        draw_analytics(canvas, result.analytics)  # zones and lines under the boxes
    dets = result.detections
    for (x1, y1, x2, y2), score, class_id, track_id in zip(dets.xyxy, dets.scores, dets.class_ids,
                                                            dets.track_ids, strict=True):
        color = tuple(int(c) for c in _PALETTE[int(class_id) % len(_PALETTE)])
        label = f"{class_names[int(class_id)]} {score:.2f}" + (f" #{track_id}" if track_id >= 0 else "")
        cv2.rectangle(canvas, (int(x1), int(y1)), (int(x2), int(y2)), color, 2)
        (tw, th), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1)
        cv2.rectangle(canvas, (int(x1), max(0, int(y1) - th - 4)), (int(x1) + tw + 2, int(y1)), color, -1)
        cv2.putText(canvas, label, (int(x1) + 1, max(th, int(y1) - 3)), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    (255, 255, 255), 1, cv2.LINE_AA)
    return canvas


@dataclass
class _Writer:
    container: av.container.OutputContainer
    stream: av.video.stream.VideoStream
    size: tuple[int, int]
    frames: int = 0
    first_pts_s: float | None = None
    last_pts_ms: int = -1


def check_output_dir(path: str) -> None:
    """Fail before the model loads when annotations could not be written to ``path`` (``annotate.dir``)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"annotate.dir {path}: exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"annotate.dir {path}: cannot create ({error.strerror})") from None


def open_output(path: Path) -> av.container.OutputContainer:
    """The MP4 container of one stream (the default ``open_output`` of :class:`AnnotateSink`)."""
    return av.open(str(path), mode="w")


class AnnotateSink(ResultSink):
    """Owns thread ``detstream.annotate`` and every output file it writes.

    ``open_output(path)`` opens a stream's MP4 container (tests pass one whose
    writes fail, to check the failure path).
    """

    name = "annotate"
    needs_image = True

    def __init__(self, out_dir: Path, class_names: tuple[str, ...], snapshots: int,
                 expected_frames: Callable[[str], int | None], fps: float = 10.0, queue_size: int = 64,
                 open_output: Callable[[Path], av.container.OutputContainer] = open_output) -> None:
        self.out_dir = out_dir
        self._dropped = 0
        self._dropped_lock = threading.Lock()
        self._failure: str | None = None
        self._open_output = open_output
        self._names = class_names
        self._snapshots = snapshots
        self._expected = expected_frames
        self._fps = fps
        self._queue: queue.Queue[tuple[FrameResult, bool] | None] = queue.Queue(maxsize=queue_size)
        self._writers: dict[str, _Writer] = {}
        self._snapshot_count: dict[str, int] = {}
        self._thread = StageThread(self._run, "detstream.annotate")

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Frames not written: queue full for a live source, or handed over after the sink failed."""
        return self._dropped

    @property
    def failure(self) -> str | None:
        """Why the sink stopped writing (``'No space left on device (ENOSPC) ...'``); None while it works."""
        return self._failure

    def submit(self, result: FrameResult, lossless: bool) -> None:
        """Called on the postprocess thread; waits only for lossless (file) sources, and only while healthy."""
        if result.meta.image is None:
            return
        if self._failure is not None:
            self._count_dropped()
            return
        if not lossless:
            try:
                self._queue.put_nowait((result, lossless))
            except queue.Full:
                self._count_dropped()
            return
        while True:
            try:
                self._queue.put((result, lossless), timeout=_PUT_POLL_S)
                return
            except queue.Full:
                if self._failure is not None or not self._thread.is_alive():
                    self._count_dropped()
                    return

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued frames and close every file (the MP4 index is written here), within ``timeout_s``."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            logger.warning("annotation sink: queue still full after %.0f s; not waiting for it", timeout_s)
            return
        self._thread.join(timeout_s)

    def _count_dropped(self, frames: int = 1) -> None:
        with self._dropped_lock:
            self._dropped += frames

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                if self._failure is not None:
                    self._count_dropped()  # drained so that nothing waits on a sink that no longer writes
                    continue
                try:
                    self._write(item[0])
                except Exception as error:  # any write error stops this optional sink, never the run
                    self._fail(error)
        finally:
            self._finish_all()

    def _fail(self, error: Exception) -> None:
        self._failure = describe_error(error)
        self._count_dropped()
        logger.warning("sink %s failed: %s; it writes nothing more in this run (detections are still published)",
                       self.name, self._failure)
        self._finish_all()

    def _finish_all(self) -> None:
        writers, self._writers = self._writers, {}
        for stream_id, writer in writers.items():
            try:
                self._finish(stream_id, writer)
            except Exception as error:  # the disk may be full: the file stays as far as it got
                if self._failure is None:
                    self._fail(error)
                else:
                    logger.info("annotated video %s not finalised: %s", self.out_dir / f"{stream_id}.mp4",
                                describe_error(error))

    def _write(self, result: FrameResult) -> None:
        meta = result.meta
        canvas = draw_detections(meta.image, result, self._names)
        writer = self._writers.get(meta.stream_id)
        if writer is None:
            writer = self._writers[meta.stream_id] = self._open(meta.stream_id, canvas.shape[1], canvas.shape[0])
        if (canvas.shape[1], canvas.shape[0]) != writer.size:
            canvas = cv2.resize(canvas, writer.size)
        frame = av.VideoFrame.from_ndarray(canvas, format="bgr24")
        frame.pts, frame.time_base = self._pts_ms(writer, meta.pts_s), _MS
        for packet in writer.stream.encode(frame):
            writer.container.mux(packet)
        writer.frames += 1
        self._maybe_snapshot(meta.stream_id, meta.seq, canvas, len(result.detections))

    def _pts_ms(self, writer: _Writer, pts_s: float | None) -> int:
        """The frame's own time in the output (ms), so the video plays at the source's real rate.

        Missing or non-increasing timestamps (a looped file) continue one nominal frame later.
        """
        step = round(1000 / self._fps)
        if pts_s is None:
            pts_ms = writer.last_pts_ms + step
        else:
            if writer.first_pts_s is None:
                writer.first_pts_s = pts_s
            pts_ms = round((pts_s - writer.first_pts_s) * 1000)
            if pts_ms <= writer.last_pts_ms:
                pts_ms = writer.last_pts_ms + step
        writer.last_pts_ms = pts_ms
        return pts_ms

    def _open(self, stream_id: str, width: int, height: int) -> _Writer:
        path = self.out_dir / f"{stream_id}.mp4"
        container = self._open_output(path)
        stream = container.add_stream("libx264", rate=Fraction(1000))
        stream.codec_context.time_base = _MS
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "26"}
        logger.info("writing annotated video %s", path)
        return _Writer(container, stream, (stream.width, stream.height))

    def _finish(self, stream_id: str, writer: _Writer) -> None:
        try:
            for packet in writer.stream.encode(None):
                writer.container.mux(packet)
        finally:
            writer.container.close()
        logger.info("annotated video %s: %d frames", self.out_dir / f"{stream_id}.mp4", writer.frames)

    def _maybe_snapshot(self, stream_id: str, seq: int, canvas: np.ndarray, count: int) -> None:
        taken = self._snapshot_count.get(stream_id, 0)
        if taken >= self._snapshots or count == 0:
            return
        total = self._expected(stream_id) or 500
        every = max(1, total // max(1, self._snapshots))
        if seq >= taken * every:
            path = self.out_dir / f"{stream_id}_{seq:06d}.jpg"
            if not cv2.imwrite(str(path), canvas):
                raise OSError(f"cannot write snapshot {path}")
            self._snapshot_count[stream_id] = taken + 1


def describe_error(error: BaseException) -> str:
    """One line for a write error: ``strerror (ENAME) writing FILE`` for OS errors, else type and message (≤ 200)."""
    if isinstance(error, OSError) and error.errno in errno.errorcode:
        text = f"{error.strerror or error} ({errno.errorcode[error.errno]})"
        if error.filename:
            text += f" writing {error.filename}"
    else:
        text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:199] + "…"
