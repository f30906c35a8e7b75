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
def clip(tmp_path_factory) -> Path:
    return make_clip(tmp_path_factory.mktemp("cameras") / "clip.mp4", frames=60, fps=10)  # 30 frames at 5 fps


@pytest.fixture(scope="module")
def cameras(clip) -> list[Path]:
    return camera_clips(clip, 3, FPS, clip.parent / "cache", max_frames=70)  # keyframes every 10 frames


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


def test_reusing_a_copy_keeps_its_name_and_marks_it_used(clip, cameras):
    import os
    import time

    mtimes = [path.stat().st_mtime_ns for path in cameras]
    long_ago = time.time_ns() - 10**9 * 86400
    for path, mtime in zip(cameras, mtimes, strict=True):
        os.utime(path, ns=(long_ago, mtime))  # last used a day ago
    again = camera_clips(clip, 3, FPS, clip.parent / "cache", max_frames=70)
    assert [p.resolve() for p in again] == [p.resolve() for p in cameras]  # not remade: same names
    assert [p.stat().st_mtime_ns for p in again] == mtimes  # the names of derived copies hash it
    assert all(p.stat().st_atime_ns > long_ago + 10**9 * 3600 for p in again)  # used now: pruned last


def test_the_cache_loses_its_least_recently_used_copies_first(tmp_path):
    import os
    import time

    from app.bench.clips import prune_cache

    now = time.time()
    files = {}
    for age, name in [(50, "old.mkv"), (40, "kept.mkv"), (30, "mid.mkv"), (20, "new.mkv"), (60, "young.part.mkv")]:
        path = tmp_path / name
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - age, now - min(age, 10)))
        files[name] = path
    removed = prune_cache(tmp_path, [files["kept.mkv"]], limit_bytes=3500)
    left = sorted(p.name for p in tmp_path.glob("*.mkv"))
    # old, then mid: kept is in use, and young.part may be another run's, being written
    assert removed == 2 and left == ["kept.mkv", "new.mkv", "young.part.mkv"]
    assert prune_cache(tmp_path, [], limit_bytes=10_000) == 0
