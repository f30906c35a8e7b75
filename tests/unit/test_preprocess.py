"""Letterboxing into a slot: geometry, padding, and the inverse mapping of boxes."""

import numpy as np
import pytest

from app.preprocess import PAD_VALUE, letterbox_geometry, letterbox_into


@pytest.mark.parametrize(("src", "dst", "scale", "pad"), [
    ((768, 576), (416, 416), 416 / 768, (0, 52)),
    ((640, 272), (416, 416), 416 / 640, (0, 119)),
    ((416, 416), (416, 416), 1.0, (0, 0)),
    ((100, 400), (416, 416), 416 / 400, (156, 0)),
])
def test_geometry_fits_the_frame_and_centres_it(src, dst, scale, pad):
    box = letterbox_geometry(*src, *dst)
    assert box.scale == pytest.approx(scale)
    assert (box.pad_x, box.pad_y) == pad


def test_letterbox_writes_scaled_rgb_and_grey_padding_in_place():
    rgb = np.zeros((576, 768, 3), np.uint8)
    rgb[..., 0] = 255
    out = np.full((3, 416, 416), -1.0, np.float32)
    box = letterbox_into(rgb, out)
    assert np.allclose(out[:, :box.pad_y, :], PAD_VALUE / 255)
    assert np.allclose(out[0, box.pad_y + 10, :], 1.0)
    assert np.allclose(out[1:, box.pad_y + 10, :], 0.0)
    assert (out >= 0).all()


def test_boxes_map_back_to_frame_pixels_and_are_clipped():
    box = letterbox_geometry(768, 576, 416, 416)
    frame_box = np.array([[100.0, 200.0, 300.0, 400.0]])
    as_input = frame_box * box.scale + np.array([box.pad_x, box.pad_y, box.pad_x, box.pad_y])
    assert np.allclose(box.to_frame(as_input), frame_box, atol=1e-3)
    outside = np.array([[-10.0, 0.0, 500.0, 416.0]])
    mapped = box.to_frame(outside)
    assert mapped[0, 0] == 0 and mapped[0, 2] == 768 and mapped[0, 1] == 0 and mapped[0, 3] == 576
