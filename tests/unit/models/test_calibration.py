"""Calibration frames: evenly spread over the footage, letterboxed like the pipeline; and the fp32 decode tail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from app.errors import ModelError
from app.models.darknet.converter import build_darknet_model
from app.models.quantization import calibration
from app.models.quantization.calibration import FrameReader, InputFit, calibration_frames, evenly_spaced
from app.models.quantization.quantize import head_nodes
from app.types import ModelSpec
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
    frames = calibration_frames(numbered_video, 4, InputFit(32, 32))
    assert len(frames) == 4 and all(f.shape == (3, 32, 32) and f.dtype == np.float32 for f in frames)
    indices = [level_to_index(f) for f in frames]
    assert all(abs(got - want) <= 1 for got, want in zip(indices, evenly_spaced(FRAMES, 4), strict=True)), indices
    assert frames[0][:, 0, 16] == pytest.approx(114 / 255)  # 64x48 into 32x32: grey letterbox rows on top


def test_a_folder_of_images_is_sampled_by_name_and_unreadable_files_are_skipped(tmp_path):
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), np.full((20, 20, 3), 10 * i, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "img5.jpg").write_bytes(b"broken")
    frames = calibration_frames(tmp_path, 10, InputFit(16, 16))
    assert len(frames) == 5


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "nothing.mp4", r"nothing\.mp4: calibration source not found"),
    (lambda p: (p / "empty").mkdir() or p / "empty", r"empty: no readable images"),
    (lambda p: (p / "text.mp4").write_text("hello") and p / "text.mp4", r"text\.mp4: cannot read calibration video"),
])
def test_an_unusable_calibration_source_is_a_one_line_modelerror(tmp_path, make, message):
    with pytest.raises(ModelError, match=message):
        calibration_frames(make(tmp_path), 5, InputFit(16, 16))


def test_a_dynamic_model_calibrates_on_the_rectangle_the_pipeline_feeds(numbered_video):
    frames = calibration_frames(numbered_video, 3, InputFit(64, 64, stride=16, rect=True))
    assert [f.shape for f in frames] == [(3, 48, 64)] * 3  # 64x48: no grey rows, the frame fills it
    assert frames[0].max() < 60 / 255  # the first frame is level 40 all over: not a pixel of 114 padding
    square = calibration_frames(numbered_video, 1, InputFit(64, 64, stride=16, rect=False))
    assert square[0].shape == (3, 64, 64) and square[0][:, 0, 32] == pytest.approx(114 / 255)


def test_a_folder_of_mixed_sizes_calibrates_each_image_at_its_own_size(tmp_path):
    for name, (h, w) in {"a": (20, 40), "b": (40, 20), "c": (30, 30)}.items():
        cv2.imwrite(str(tmp_path / f"{name}.png"), np.full((h, w, 3), 90, np.uint8))
    frames = calibration_frames(tmp_path, 3, InputFit(64, 64, stride=8, rect=True))
    assert [f.shape for f in frames] == [(3, 32, 64), (3, 64, 32), (3, 64, 64)]


def test_a_one_pixel_padding_row_is_grey_not_leftover_memory(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), np.full((40, 48, 3), 90, np.uint8))  # 32x27 in a 32x28 input
    for _ in range(3):  # np.empty would hand back this loop's freed buffers
        frame = calibration_frames(tmp_path, 1, InputFit(32, 32, stride=2, rect=True))[0]
        assert frame.shape == (3, 28, 32)
        np.testing.assert_array_equal(frame[:, 27, :], np.float32(114 / 255))
        frame[:] = 7.0


def test_input_fit_of_a_spec_is_rectangular_exactly_when_the_model_is_dynamic():
    spec = ModelSpec(name="m", path="m.onnx", input_name="images", input_height=416, input_width=416,
                     layout="yolov5", class_names=("a",), dynamic_hw=True)
    assert InputFit.of(spec).size(768, 576) == (320, 416)
    assert InputFit.of(replace(spec, dynamic_hw=False)).size(768, 576) == (416, 416)
    assert InputFit.of(replace(spec, stride=64)).size(640, 272) == (192, 416)


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
