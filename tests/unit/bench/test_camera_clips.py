"""The live bench's simulated cameras: each keeps its phase for the whole run, because none loops."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from app.bench.clips import camera_clips
from tests.integration.rtsp import make_clip

FPS = 5


@pytest.fixture(scope="module")
def cameras(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("cameras")
    clip = make_clip(folder / "clip.mp4", frames=60, fps=10)  # 6 s: 30 frames at 5 fps, keyframes every 10
    return camera_clips(clip, 3, FPS, folder / "cache", max_frames=70)


def _decoded(path: Path) -> tuple[list[float], list[np.ndarray]]:
    times, pixels = [], []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            times.append(float(frame.time))
            pixels.append(frame.to_ndarray(format="gray"))
    return times, pixels


def test_each_camera_holds_the_frames_asked_for_by_repeating_the_clip(cameras):
    for path in cameras:
        times, pixels = _decoded(path)
        assert len(times) == 70, path  # 30 frames of content, round and round: no loop needed for 14 s
        assert np.array_equal(pixels[1], pixels[31]) and not np.array_equal(pixels[1], pixels[2])


def test_camera_i_is_i_over_k_of_an_interval_late_from_its_second_frame_to_its_last(cameras):
    for i, path in enumerate(cameras):
        steps = np.diff(_decoded(path)[0])
        phase = i / len(cameras) / FPS
        assert steps[0] == pytest.approx(1 / FPS + phase, abs=1e-3)
        assert np.allclose(steps[1:], 1 / FPS, atol=1e-3), steps  # the phase stays: no step shorter or longer


def test_cameras_start_at_different_frames_of_the_clip(cameras):
    firsts = [_decoded(path)[1][0] for path in cameras]
    assert not np.array_equal(firsts[0], firsts[1]) and not np.array_equal(firsts[1], firsts[2])
