"""Letterboxing into a slot: geometry, padding, and the inverse mapping of boxes."""

import numpy as np
import pytest

from app.preprocess import PAD_VALUE, fit_input_size, letterbox_geometry, letterbox_into


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


@pytest.mark.parametrize(("src", "rect", "expected"), [
    ((768, 576), True, (320, 416)),    # vtest: 416x312 content, padded to the next multiple of 32
    ((640, 272), True, (192, 416)),    # bikes: 416x177
    ((1920, 1080), True, (256, 416)),  # 16:9 camera: 416x234
    ((576, 768), True, (416, 320)),    # portrait
    ((416, 416), True, (416, 416)),
    ((4000, 10), True, (32, 416)),     # never below one stride
    ((768, 576), False, (416, 416)),   # square letterbox when rect is off
])
def test_rect_input_is_the_smallest_stride_multiple_that_holds_the_frame(src, rect, expected):
    assert fit_input_size(*src, 416, 416, 32, rect) == expected


def test_letterbox_into_a_rect_input_centres_the_frame_with_a_few_rows_of_padding():
    rgb = np.full((576, 768, 3), 200, np.uint8)
    out = np.full((3, 320, 416), -1.0, np.float32)
    box = letterbox_into(rgb, out)
    assert (box.pad_x, box.pad_y) == (0, 4)
    assert np.allclose(out[:, :4, :], PAD_VALUE / 255) and np.allclose(out[:, 316:, :], PAD_VALUE / 255)
    assert np.allclose(out[:, 4:316, :], 200 / 255)


def test_channels_keep_their_order_rgb_in_rgb_out():
    rgb = np.zeros((100, 200, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 10, 20, 30
    out = np.zeros((3, 96, 192), np.float32)
    letterbox_into(rgb, out)
    assert [round(float(out[c, 48, 96]) * 255) for c in range(3)] == [10, 20, 30]


def test_a_single_row_of_padding_is_written_even_when_it_all_falls_below_the_frame():
    rgb = np.full((95, 100, 3), 50, np.uint8)  # scales to exactly 95 rows in a 96-row input: 0 above, 1 below
    out = np.full((3, 96, 100), -1.0, np.float32)  # what the slot's previous frame left behind
    box = letterbox_into(rgb, out)
    assert box.pad_y == 0
    assert np.allclose(out[:, 95, :], PAD_VALUE / 255)
    assert (out >= 0).all()


@pytest.mark.parametrize(("src", "dst"), [((768, 576), (320, 416)), ((640, 272), (416, 416)), ((95, 100), (96, 100))])
def test_a_uint8_slot_gets_the_same_picture_as_pixels_channels_last(src, dst):
    """The engine that scales in its graph (UINT8_HWC) sees exactly the float slot's picture, times 255."""
    rgb = np.random.default_rng(1).integers(0, 256, (src[1], src[0], 3), dtype=np.uint8)
    floats = np.full((3, *dst), -1.0, np.float32)
    pixels = np.full((*dst, 3), 7, np.uint8)  # what the slot's previous frame left behind
    assert letterbox_into(rgb, pixels) == letterbox_into(rgb, floats)
    np.testing.assert_array_equal(pixels.transpose(2, 0, 1), np.round(floats * 255).astype(np.uint8))
