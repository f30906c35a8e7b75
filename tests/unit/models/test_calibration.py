"""Calibration frames: evenly spread over the footage, letterboxed like the pipeline; and the fp32 decode tail."""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from app.errors import ModelError
from app.models import calibration
from app.models.calibration import FrameReader, calibration_frames, evenly_spaced
from app.models.darknet import build_darknet_model
from app.models.quantize import head_nodes
from tests.unit.models.tiny_darknet import write_tiny_net

FRAMES = 60


@pytest.fixture(scope="module")
def numbered_video(tmp_path_factory) -> Path:
    """60 grey frames, 64x48, frame i at level 40 + 3i, so a sampled frame tells its own index."""
    path = tmp_path_factory.mktemp("video") / "numbered.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"qscale": "2"}
        for i in range(FRAMES):
            image = np.full((48, 64, 3), 40 + 3 * i, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))
    return path


def level_to_index(frame: np.ndarray) -> int:
    """The frame index encoded in the grey level of the image part (the letterbox rows are 114)."""
    centre = frame[:, frame.shape[1] // 2, frame.shape[2] // 2] * 255
    return round((float(centre.mean()) - 40) / 3)


@pytest.mark.parametrize(("total", "count", "expected"), [
    (10, 3, [0, 4, 9]),     # linspace(0, 9, 3) = 0, 4.5, 9; 4.5 rounds to even
    (5, 10, [0, 1, 2, 3, 4]),
    (795, 1, [0]),
    (0, 5, []),
    (7, 0, []),
])
def test_evenly_spaced_indices_cover_the_whole_range(total, count, expected):
    assert evenly_spaced(total, count) == expected


@pytest.mark.parametrize("seek", [False, True], ids=["decode", "seek"])
def test_video_frames_are_evenly_sampled_and_letterboxed(numbered_video, monkeypatch, seek):
    if seek:
        monkeypatch.setattr(calibration, "SEEK_ABOVE_FRAMES", 0)
    frames = calibration_frames(numbered_video, 4, 32, 32, 1 / 255)
    assert len(frames) == 4 and all(f.shape == (3, 32, 32) and f.dtype == np.float32 for f in frames)
    indices = [level_to_index(f) for f in frames]
    assert all(abs(got - want) <= 1 for got, want in zip(indices, evenly_spaced(FRAMES, 4), strict=True)), indices
    assert frames[0][:, 0, 16] == pytest.approx(114 / 255)  # 64x48 into 32x32: grey letterbox rows on top


def test_a_folder_of_images_is_sampled_by_name_and_unreadable_files_are_skipped(tmp_path):
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), np.full((20, 20, 3), 10 * i, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "img5.jpg").write_bytes(b"broken")
    frames = calibration_frames(tmp_path, 10, 16, 16, 1 / 255)
    assert len(frames) == 5


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "nothing.mp4", r"nothing\.mp4: calibration source not found"),
    (lambda p: (p / "empty").mkdir() or p / "empty", r"empty: no readable images"),
    (lambda p: (p / "text.mp4").write_text("hello") and p / "text.mp4", r"text\.mp4: cannot read calibration video"),
])
def test_an_unusable_calibration_source_is_a_one_line_modelerror(tmp_path, make, message):
    with pytest.raises(ModelError, match=message):
        calibration_frames(make(tmp_path), 5, 16, 16, 1 / 255)


def test_frame_reader_feeds_batch_one_inputs_and_rewinds():
    frames = [np.full((3, 4, 4), i, np.float32) for i in range(3)]
    reader = FrameReader("images", frames)
    seen = []
    for _ in range(10):  # bounded: the reader must stop by itself
        item = reader.get_next()
        if item is None:
            break
        seen.append(item["images"])
    assert [s.shape for s in seen] == [(1, 3, 4, 4)] * 3
    reader.rewind()
    assert reader.get_next()["images"][0, 0, 0, 0] == 0


def test_the_decode_tail_is_every_node_after_the_last_convolutions(tmp_path):
    net = write_tiny_net(tmp_path)
    model = build_darknet_model(net.cfg, net.weights, net.names)
    tail = set(head_nodes(model))
    assert tail == {n.name for n in model.graph.node if n.name.startswith("head/")} | {"output"}
    with_convs = set(head_nodes(model, include_output_convs=True))
    assert with_convs - tail == {"L6/conv", "L12/conv"}
