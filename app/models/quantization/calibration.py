"""Calibration frames for INT8: the operator's own footage, letterboxed exactly as the pipeline does it.

Static INT8 fixes one scale per tensor from what it sees here, so the frames
must look like production input: same letterbox (``app.preprocess``), same
pixel scale, and spread over the whole clip rather than its first seconds
(a clip that starts empty would calibrate for an empty scene).

A model with a dynamic input (``ModelSpec.dynamic_hw``) runs each frame at
:func:`app.preprocess.fit_input_size` with ``rect=True``, the smallest
multiple of the stride that holds it (416×320 for a 4:3 camera), so that is
what it is calibrated on: each frame at its own size. A video has one size;
a folder of mixed images gives several, which ONNX Runtime's calibrators
take one frame (batch 1) at a time, so every tensor's range is gathered over
all of them, at the sizes the pipeline will feed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import cv2
import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from app.errors import ModelError
from app.preprocess import PAD_VALUE, fit_input_size, letterbox_into
from app.sources.rgb import RgbConverter
from app.types import FLOAT_CHW, FrameFormat, ModelSpec

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
SEEK_ABOVE_FRAMES = 3000  # longer videos are sampled by seeking instead of decoding every frame


def evenly_spaced(total: int, count: int) -> list[int]:
    """``count`` distinct indices spread over ``range(total)``, first and last included (all when fewer)."""
    if total <= 0 or count <= 0:
        return []
    if count >= total:
        return list(range(total))
    return sorted({round(float(i)) for i in np.linspace(0, total - 1, count)})


@dataclass(frozen=True, slots=True)
class InputFit:
    """How frames become model inputs: the nominal ``height`` × ``width``, pixel ``scale``, and with ``rect``
    the smaller stride-multiple rectangle the pipeline uses for dynamic models."""

    height: int
    width: int
    scale: float = 1.0 / 255.0
    stride: int = 32
    rect: bool = False

    @classmethod
    def of(cls, spec: ModelSpec) -> InputFit:
        """The pipeline's choice for ``spec``: rectangular exactly when the model's input is dynamic."""
        return cls(spec.input_height, spec.input_width, spec.scale, spec.stride, spec.dynamic_hw)

    def size(self, src_width: int, src_height: int) -> tuple[int, int]:
        """``(height, width)`` of the input for a frame of this size."""
        return fit_input_size(src_width, src_height, self.width, self.height, self.stride, self.rect)

    def blank(self, src_width: int, src_height: int, frame_format: FrameFormat = FLOAT_CHW) -> np.ndarray:
        """A grey input for a frame of this size in ``frame_format`` (``(3, H, W)`` float32 unless told),
        ready for ``letterbox_into``.

        Pre-filled because ``letterbox_into`` leaves a lone padding row or
        column unwritten when the padding is one pixel in total (its top/left
        share rounds to 0); left as ``np.empty`` that row is garbage, and one
        huge value ruins a calibrated range.
        """
        grey = PAD_VALUE if frame_format.channels_last else PAD_VALUE * self.scale
        return np.full(frame_format.shape(*self.size(src_width, src_height)), grey, frame_format.dtype)

    def letterbox(self, rgb: np.ndarray) -> np.ndarray:
        """``rgb`` ``(h, w, 3) uint8`` letterboxed into a new ``(3, H, W)`` float32 input."""
        out = self.blank(rgb.shape[1], rgb.shape[0])
        letterbox_into(rgb, out, self.scale)
        return out


def video_frame_count(path: Path) -> int:
    """Frames in the first video stream: the header's count, else counted from packets (no decoding)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        return sum(1 for packet in container.demux(stream) if packet.size)


def decode_frames(path: Path, wanted: list[int]) -> Iterator[tuple[int, np.ndarray]]:
    """``(index, rgb)`` of the wanted frames (sorted indices), decoding sequentially and converting only those."""
    wanted_set, last = set(wanted), max(wanted)
    rgb = RgbConverter()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted_set:
                yield index, rgb.convert(frame).copy()
            if index >= last:
                return


def _seek_selected(path: Path, wanted: list[int], total: int) -> Iterator[tuple[int, np.ndarray]]:
    """One seek per sample: the first frame at or after each evenly spaced timestamp."""
    rgb = RgbConverter()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = float(container.duration or 0) / 1e6
        for index in wanted:
            target_s = duration * index / max(total, 1)
            container.seek(int(target_s / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.time is None or frame.time >= target_s - 1e-3:
                    yield index, rgb.convert(frame).copy()
                    break


def video_frames(path: Path, count: int, fit: InputFit) -> list[np.ndarray]:
    """``count`` letterboxed ``(3, H, W)`` float32 frames at :func:`evenly_spaced` indices of the video."""
    try:
        total = video_frame_count(path)
        wanted = evenly_spaced(total, count)
        if not wanted:
            raise ModelError(f"{path}: no video frames to calibrate on")
        picker = _seek_selected(path, wanted, total) if total > SEEK_ABOVE_FRAMES else decode_frames(path, wanted)
        frames = [fit.letterbox(rgb) for _, rgb in picker]
    except (av.FFmpegError, IndexError) as error:
        raise ModelError(f"{path}: cannot read calibration video ({error})") from None
    logger.info("calibration: %d frames of %s (%d in the video)", len(frames), path.name, total)
    return frames


def image_frames(folder: Path, count: int, fit: InputFit) -> list[np.ndarray]:
    """Up to ``count`` letterboxed frames from the images in ``folder`` (sorted by name, evenly sampled),
    each at its own :meth:`InputFit.size`."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    frames = []
    for index in evenly_spaced(len(files), count):
        bgr = cv2.imread(str(files[index]), cv2.IMREAD_COLOR)
        if bgr is None:
            logger.warning("calibration: skipping unreadable image %s", files[index])
            continue
        frames.append(fit.letterbox(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)))
    if not frames:
        raise ModelError(f"{folder}: no readable images ({', '.join(IMAGE_SUFFIXES)}) to calibrate on")
    return frames


def calibration_frames(source: Path, count: int, fit: InputFit) -> list[np.ndarray]:
    """Frames from a video file or a folder of images; a one-line ModelError when there are none."""
    source = Path(source)
    if source.is_dir():
        return image_frames(source, count, fit)
    if not source.is_file():
        raise ModelError(f"{source}: calibration source not found (give a video file or a folder of images)")
    return video_frames(source, count, fit)


class FrameReader(CalibrationDataReader):
    """Feeds prepared frames to ONNX Runtime's calibrator one at a time (batch 1), each at its own size."""

    def __init__(self, input_name: str, frames: list[np.ndarray]) -> None:
        self._input_name = input_name
        self._frames = frames
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self._frames):
            return None
        frame = self._frames[self._next]
        self._next += 1
        return {self._input_name: frame[None]}

    def rewind(self) -> None:
        self._next = 0
