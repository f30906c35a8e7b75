"""PyAVSource: the one source implementation (files, rtsp/rtsps, http(s)/HLS, /dev/videoN).

One decoder thread per source, ``detstream.decode.<id>``, owns the PyAV
container. Per decoded frame: decimate (``max_fps``) → pace (``realtime``) →
take a ring slot from the sink → letterbox into it → commit with a
:class:`FrameMeta`. ``seq`` counts frames admitted past decimation, from 0,
across loop restarts and reconnects; a frame admitted but dropped for lack of
a slot (live mode) still uses its seq, so a gap in seqs equals the drops.

States: ``connecting`` → ``running`` (first frame) → ``ended``/``failed``;
network sources (and devices) go ``reconnecting`` → ``connecting`` on any
retryable failure, forever, with :class:`Backoff` delays. The thread ends
with exactly one terminal status followed by ``sink.close_stream(id)``.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import replace

import av
import cv2
import numpy as np

from app.config import SourceConfig, SourceKind, SourceMode
from app.errors import SourceConnectionError, StateError
from app.preprocess import fit_input_size, letterbox_into
from app.redact import redact_url
from app.sources import interrupt
from app.sources.backoff import Backoff
from app.sources.base import FrameSink, FrameSource, SourceState, SourceStatus, StatusCallback
from app.sources.failures import FailureKind, describe
from app.sources.hwdecode import hwaccel_for
from app.sources.opening import open_container, source_error
from app.sources.pacing import Decimator, RealtimePacer
from app.sources.rgb import RgbConverter
from app.threads import StageThread
from app.types import FrameMeta

logger = logging.getLogger(__name__)

MAX_BAD_PACKETS = 200  # consecutive undecodable packets before a source is called corrupt
RETRYING_KINDS = (SourceKind.RTSP, SourceKind.HTTP, SourceKind.DEVICE)


class PyAVSource(FrameSource):
    """Decodes one source into the sink on its own thread; never raises out of it.

    ``input_hw`` is the model input ``(height, width)`` the sink's slots have;
    with ``rect`` each frame is letterboxed to the smallest multiple of
    ``stride`` that holds it instead (:func:`app.preprocess.fit_input_size`);
    ``pixel_scale`` multiplies pixels (1/255 for YOLO); ``keep_image`` keeps a
    BGR copy of each frame in ``FrameMeta.image`` (for annotation).
    ``backoff`` replaces the one built from ``config.reconnect`` (tests).
    """

    def __init__(
        self,
        config: SourceConfig,
        sink: FrameSink,
        on_status: StatusCallback,
        *,
        input_hw: tuple[int, int],
        stride: int = 32,
        rect: bool = False,
        pixel_scale: float = 1.0 / 255.0,
        keep_image: bool = False,
        backoff: Backoff | None = None,
    ) -> None:
        if config.id is None:
            raise ValueError(f"source {config.safe_url}: id must be set (DetstreamConfig derives one)")
        self.config = config
        self.stream_id = config.id
        self.input_hw = input_hw
        self._stride = stride
        self._rect = rect
        self._sizes: dict[tuple[int, int], tuple[int, int]] = {}  # frame (w, h) -> input (h, w)
        self._rgb = RgbConverter()  # its buffer is reused: letterbox and annotation copy out of it
        self._sink = sink
        self._on_status = on_status
        self._pixel_scale = pixel_scale
        self._keep_image = keep_image
        self._retries = config.kind in RETRYING_KINDS
        self._live = config.effective_mode is SourceMode.LIVE
        self._backoff = backoff or Backoff.from_config(config.reconnect)
        self._decimator = Decimator(config.max_fps)
        self._pacer = RealtimePacer() if config.realtime and config.kind is SourceKind.FILE else None
        self._stop = threading.Event()
        self._lifecycle = threading.Lock()  # orders stop()'s interrupt request against the thread's end
        self._finished = False
        self._thread = StageThread(self._run, f"detstream.decode.{self.stream_id}")
        self._seq = 0
        self._damaged = 0  # undecodable packets and frames the decoder flagged corrupt
        self._total_frames: int | None = None
        self._hw_disabled = False
        self._first_of_session = True
        interrupt.install()

    # -- control (any thread) ----------------------------------------------
    def start(self) -> None:
        if self._thread.ident is not None:
            raise StateError(f"source {self.stream_id}: already started")
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; a blocked network read/open is interrupted at once."""
        self._stop.set()
        with self._lifecycle:
            if self._thread.ident is not None and not self._finished:
                interrupt.request(self._thread.ident)

    def set_max_fps(self, max_fps: float | None) -> None:
        """Change decimation from the next frame on, without reconnecting (one attribute write)."""
        self._decimator.interval_s = 1.0 / max_fps if max_fps else 0.0

    def join(self, timeout_s: float | None = None) -> bool:
        return self._thread.join_within(timeout_s)

    @property
    def total_frames(self) -> int | None:
        return self._total_frames

    @property
    def frames(self) -> int:
        """Frames admitted so far (the next seq)."""
        return self._seq

    # -- the thread (detstream.decode.<id>) ----------------------------------
    def _run(self) -> None:
        terminal = self._status(SourceState.ENDED, "stopped")
        try:
            terminal = self._serve()
        except Exception as exc:  # the thread never raises: report and end the stream
            text = redact_url("".join(traceback.format_exception(exc)))
            logger.error("source %s: decoder thread failed: %s", self.stream_id, text,
                         extra={"source_id": self.stream_id})
            terminal = self._status(SourceState.FAILED, f"{self.config.safe_url}: internal error: {describe(exc)}",
                                    error_kind=FailureKind.UNKNOWN.value)
        finally:
            self._finish(terminal)

    def _finish(self, terminal: SourceStatus) -> None:
        if self._damaged:
            logger.warning("source %s: %d damaged frames (corrupt data; the decoder recovered at the next keyframe)",
                           self.stream_id, self._damaged, extra={"source_id": self.stream_id})
            terminal = replace(terminal, reason=f"{terminal.reason}; {self._damaged} damaged frames")
        with self._lifecycle:
            self._finished = True
            interrupt.clear(threading.get_ident())
        log = logger.warning if terminal.state is SourceState.FAILED else logger.info
        log("source %s: %s (%s)", self.stream_id, terminal.state.value, terminal.reason,
            extra={"source_id": self.stream_id})
        try:
            self._on_status(terminal)
        except Exception:
            logger.exception("source %s: status callback failed", self.stream_id, extra={"source_id": self.stream_id})
        finally:
            self._sink.close_stream(self.stream_id)

    def _serve(self) -> SourceStatus:
        """Open, decode, and reopen until the end, a fatal error, or stop."""
        while not self._stop.is_set():
            self._report(SourceState.CONNECTING, self.config.safe_url, attempt=self._backoff.attempt)
            try:
                self._session()
            except SourceConnectionError as error:
                if self._stop.is_set():
                    break
                if not (self._retries and error.retryable):
                    return self._status(SourceState.FAILED, str(error), error_kind=error.kind)
                if not self._wait_to_retry(error):
                    break
                continue
            if self._stop.is_set():
                break
            if not self.config.loop:
                return self._status(SourceState.ENDED, f"{self.config.safe_url}: end of file")
            self._decimator.reset()
            if self._pacer is not None:
                self._pacer.reset()
        return self._status(SourceState.ENDED, "stopped")

    def _wait_to_retry(self, error: SourceConnectionError) -> bool:
        delay = self._backoff.next_delay()
        self._report(SourceState.RECONNECTING, str(error), attempt=self._backoff.attempt,
                     retry_in_s=round(delay, 3), error_kind=error.kind)
        return not self._stop.wait(delay)

    def _session(self) -> None:
        """One connection, decoded to its end; raises SourceConnectionError on failure.

        With ``decode: cuda``, a session that fails before its first frame is
        retried at once on the CPU, and hardware decoding stays off.
        """
        accel = self._hwaccel()
        try:
            self._decode_container(accel)
        except SourceConnectionError as error:
            if accel is None or not self._first_of_session or self._stop.is_set():
                raise
            self._hw_disabled = True
            logger.warning("source %s: CUDA decode failed, decoding on the CPU: %s", self.stream_id, error,
                           extra={"source_id": self.stream_id})
            self._decode_container(None)

    def _decode_container(self, accel: object | None) -> None:
        container = open_container(self.config, accel)
        try:
            stream = self._video_stream(container)
            expected = stream.frames or None
            if self.config.kind is SourceKind.FILE:
                self._total_frames = None if self.config.loop else self._estimate_total(container, stream)
            decoded = self._decode(container, stream)
        finally:
            container.close()
        if self._stop.is_set():
            return
        if self.config.kind is SourceKind.FILE and expected and decoded < expected:
            raise SourceConnectionError(
                f"{self.config.safe_url}: truncated or corrupt, decoded {decoded} of {expected} frames",
                FailureKind.CORRUPT.value, False)
        if self._retries:
            raise SourceConnectionError(f"{self.config.safe_url}: eof: the server ended the stream",
                                        FailureKind.EOF.value, True)

    def _video_stream(self, container: av.container.InputContainer) -> av.VideoStream:
        if not container.streams.video:
            raise SourceConnectionError(f"{self.config.safe_url}: no video stream (not a video)",
                                        FailureKind.CORRUPT.value, False)
        stream = container.streams.video[0]
        if stream.codec_context is None:
            raise SourceConnectionError(f"{self.config.safe_url}: unsupported codec (no decoder in this FFmpeg)",
                                        FailureKind.UNSUPPORTED_CODEC.value, False)
        # Frame threading ("AUTO") holds thread_count - 1 frames back, a frame interval each: at camera rates
        # that is most of a live source's staleness budget. Live sources use slice threading.
        stream.thread_type = "SLICE" if self._live else "AUTO"
        return stream

    def _estimate_total(self, container: av.container.InputContainer, stream: av.VideoStream) -> int | None:
        total = stream.frames or None
        rate = float(stream.average_rate or 0) or None
        if total is None and rate:
            if stream.duration and stream.time_base:
                total = round(float(stream.duration * stream.time_base) * rate)
            elif container.duration:
                total = round(container.duration / 1_000_000 * rate)
        if total and rate and self.config.max_fps and self.config.max_fps < rate:
            total = round(total * self.config.max_fps / rate)
        return total or None

    def _decode(self, container: av.container.InputContainer, stream: av.VideoStream) -> int:
        """Decode every video packet until EOF or stop; returns frames decoded (before decimation)."""
        decoded = bad = 0
        last_frame_at = time.monotonic()
        packets = container.demux()
        try:
            for packet in packets:
                if self._stop.is_set():
                    break
                if self._retries and time.monotonic() - last_frame_at > self.config.stall_timeout_s:
                    raise SourceConnectionError(  # packets (audio, undecodable video) but no frame
                        f"{self.config.safe_url}: timeout: stalled, no frame for {self.config.stall_timeout_s:g} s",
                        FailureKind.TIMEOUT.value, True)
                if packet.stream_index != stream.index:
                    continue
                started = time.perf_counter()
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError as exc:
                    bad += 1
                    self._damaged += 1
                    logger.debug("source %s: undecodable packet: %s", self.stream_id, describe(exc),
                                 extra={"source_id": self.stream_id})
                    if bad >= MAX_BAD_PACKETS:
                        raise source_error(self.config, exc, "decode") from None
                    continue
                if frames:
                    bad = 0
                    last_frame_at = time.monotonic()
                decode_ms = (time.perf_counter() - started) * 1000.0 / max(1, len(frames))
                for frame in frames:
                    decoded += 1
                    if getattr(frame, "is_corrupt", False):
                        self._damaged += 1
                    if not self._deliver(frame, decode_ms):
                        return decoded
        except (av.FFmpegError, OSError) as exc:
            if self._stop.is_set():
                return decoded
            read_timeout_s = min(self.config.read_timeout_s, self.config.stall_timeout_s)
            if self._retries and time.monotonic() - last_frame_at >= read_timeout_s:
                raise SourceConnectionError(
                    f"{self.config.safe_url}: timeout: stalled, no data for {read_timeout_s:g} s",
                    FailureKind.TIMEOUT.value, True) from None
            raise source_error(self.config, exc, "read") from None
        finally:
            packets.close()
        return decoded

    def _deliver(self, frame: av.VideoFrame, decode_ms: float) -> bool:
        """Decimate, pace, letterbox into a slot and commit one frame; False when stopping."""
        pts_s = float(frame.time) if frame.time is not None else None
        if not self._decimator.admit(pts_s if self.config.kind is SourceKind.FILE else time.monotonic()):
            return True
        if self._pacer is not None and not self._pacer.wait(pts_s, self._stop.wait):
            return False
        started = time.perf_counter()
        rgb = self._rgb.convert(frame)
        decode_ms += (time.perf_counter() - started) * 1000.0
        captured_at, t_captured = time.time(), time.monotonic()
        seq = self._seq
        slot = self._sink.acquire(self.stream_id, self._stop)
        if slot is None:
            if self._stop.is_set():
                return False
            self._seq += 1
            self._sink.count_drop(self.stream_id)
            return True
        try:
            box = letterbox_into(rgb, slot.shape_to(*self._input_size(rgb)), self._pixel_scale)
        except BaseException:
            self._sink.abandon(slot)
            raise
        image = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR) if self._keep_image else None
        meta = FrameMeta(self.stream_id, seq, pts_s, captured_at, t_captured, decode_ms, box, image=image)
        self._seq += 1
        self._sink.commit(slot, meta)
        if self._first_of_session:
            self._first_of_session = False
            self._backoff.running()
            self._report(SourceState.RUNNING, f"{self.config.safe_url}: {rgb.shape[1]}x{rgb.shape[0]}")
        return True

    def _input_size(self, rgb: np.ndarray) -> tuple[int, int]:
        """The model input (height, width) for a frame of this size (cached: a camera rarely changes size)."""
        key = (rgb.shape[1], rgb.shape[0])
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = fit_input_size(*key, self.input_hw[1], self.input_hw[0], self._stride,
                                                     self._rect)
        return size

    def _hwaccel(self) -> object | None:
        if self.config.decode != "cuda" or self._hw_disabled:
            return None
        accel, reason = hwaccel_for("cuda")
        if accel is None:
            self._hw_disabled = True
            logger.warning("source %s: CUDA decode unavailable, decoding on the CPU: %s", self.stream_id, reason,
                           extra={"source_id": self.stream_id})
        return accel

    # -- status -------------------------------------------------------------
    def _status(self, state: SourceState, reason: str = "", **fields: object) -> SourceStatus:
        return SourceStatus(self.stream_id, state, redact_url(reason), frames=self._seq, **fields)

    def _report(self, state: SourceState, reason: str = "", **fields: object) -> None:
        if state is SourceState.CONNECTING:
            self._first_of_session = True
        status = self._status(state, reason, **fields)
        log = logger.warning if state is SourceState.RECONNECTING else logger.info
        log("source %s: %s (%s)", self.stream_id, state.value, status.reason, extra={"source_id": self.stream_id})
        self._on_status(status)
