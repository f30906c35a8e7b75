"""RgbConverter: OpenCV on the decoder's own planes where that is what swscale would compute, swscale otherwise."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from app.sources.rgb import RgbConverter, fast_path


def first_frames(path: Path, count: int) -> list[av.VideoFrame]:
    with av.open(str(path)) as container:
        frames = []
        for frame in container.decode(video=0):
            frames.append(frame)
            if len(frames) >= count:
                return frames
    return frames


def synthetic(width: int, height: int, fmt: str = "yuv420p", colorspace: int | None = None,
              color_range: int | None = None) -> av.VideoFrame:
    """A colourful RGB test card converted by swscale to ``fmt``, tagged as asked."""
    ys, xs = np.mgrid[0:height, 0:width]
    rgb = np.stack([(xs * 255 // max(1, width - 1)), (ys * 255 // max(1, height - 1)), ((xs + ys) % 256)],
                   axis=-1).astype(np.uint8)
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=fmt)
    if colorspace is not None:
        frame.colorspace = colorspace
    if color_range is not None:
        frame.color_range = color_range
    return frame


@pytest.mark.parametrize("clip", ["vtest", "bikes"])
def test_real_clips_take_the_fast_path_and_stay_within_a_level_of_swscale(clip, request):
    frames = first_frames(request.getfixturevalue(clip), 10)
    converter = RgbConverter()
    for frame in frames:
        assert fast_path(frame)
        mine = converter.convert(frame).astype(np.int16)
        reference = frame.to_ndarray(format="rgb24").astype(np.int16)
        diff = np.abs(mine - reference)
        assert mine.shape == reference.shape
        assert diff.mean() < 2.0 and np.percentile(diff, 99) <= 8, (diff.mean(), np.percentile(diff, 99))


@pytest.mark.parametrize(("width", "height"), [(100, 60), (642, 270), (64, 2)])
def test_rows_are_read_without_the_decoders_line_padding(width, height):
    frame = synthetic(width, height)
    assert frame.planes[0].line_size >= width
    mine = RgbConverter().convert(frame).astype(np.int16)
    diff = np.abs(mine - frame.to_ndarray(format="rgb24").astype(np.int16))
    assert mine.shape == (height, width, 3) and diff.mean() < 2.0


@pytest.mark.parametrize(("why", "frame"), [
    ("bt709 matrix", lambda: synthetic(64, 48, colorspace=1)),
    ("full range", lambda: synthetic(64, 48, color_range=2)),
    ("yuvj420p", lambda: synthetic(64, 48, fmt="yuvj420p")),
    ("nv12", lambda: synthetic(64, 48, fmt="nv12")),
    ("yuv422p", lambda: synthetic(64, 48, fmt="yuv422p")),
    ("odd width", lambda: synthetic(63, 48)),
])
def test_frames_opencv_would_convert_differently_keep_swscale_exactly(why, frame):
    frame = frame()
    assert not fast_path(frame), why
    np.testing.assert_array_equal(RgbConverter().convert(frame), frame.to_ndarray(format="rgb24"))


def test_the_buffer_is_reused_per_size_and_follows_a_resolution_change():
    converter = RgbConverter()
    small, large = synthetic(64, 48), synthetic(128, 96)
    first = converter.convert(small)
    assert converter.convert(small) is first
    bigger = converter.convert(large)
    assert bigger.shape == (96, 128, 3)
    again = converter.convert(small)
    reference = small.to_ndarray(format="rgb24").astype(np.int16)
    assert again.shape == (48, 64, 3) and np.abs(again.astype(np.int16) - reference).mean() < 2.0
