"""decode_batch on the three output layouts, fed through real ONNX Runtime sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.errors import ModelError
from app.postprocess.yolo import check_layout, decode_batch
from app.types import Letterbox, ModelSpec

CLASSES = ("person", "car", "dog")
# frame 640x480 letterboxed into 320x320: x_input = x_frame * 0.5, y_input = y_frame * 0.5 + 40
WIDE = Letterbox(scale=0.5, pad_x=0.0, pad_y=40.0, src_width=640, src_height=480)
SQUARE = Letterbox(scale=1.0, pad_x=0.0, pad_y=0.0, src_width=320, src_height=320)


def spec(layout: str) -> ModelSpec:
    return ModelSpec(name="tiny", path="tiny.onnx", input_name="raw", input_height=320, input_width=320,
                     layout=layout, class_names=CLASSES)


def run_identity_model(raw: np.ndarray) -> list[np.ndarray]:
    """An ONNX graph whose output is its input, run by ONNX Runtime: the engine's real output path."""
    dims = ["batch", *raw.shape[1:]]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["raw"], ["output0"])], "identity",
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"raw": raw.astype(np.float32)})


def run_constant_model(value: np.ndarray) -> list[np.ndarray]:
    """An ONNX graph that outputs a constant tensor (what an end-to-end NMS model returns)."""
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["output0"], value=numpy_helper.from_array(value.astype(np.float32)))],
        "constant", [], [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(value.shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {})


def yolov5_row(cx, cy, w, h, objectness, probs) -> list[float]:
    return [cx, cy, w, h, objectness, *probs]


# Frame 0 (WIDE letterbox), input pixels; the comment gives the expected frame box.
FRAME0_V5 = [
    yolov5_row(100, 100, 40, 20, 0.9, [0.1, 0.8, 0.1]),  # car 0.72 -> (160, 100, 240, 140)
    yolov5_row(101, 100, 40, 20, 0.8, [0.1, 0.8, 0.1]),  # car 0.64, IoU 0.95 with the first: suppressed
    yolov5_row(100, 100, 40, 20, 0.9, [0.0, 0.1, 0.7]),  # dog 0.63 on the same spot: other class, kept
    yolov5_row(200, 200, 20, 20, 0.2, [1.0, 0.0, 0.0]),  # objectness 0.2 <= 0.25: dropped early
    yolov5_row(200, 200, 20, 20, 0.5, [0.4, 0.0, 0.0]),  # 0.5 * 0.4 = 0.2 <= 0.25: dropped
]
# Frame 1 (SQUARE letterbox).
FRAME1_V5 = [
    yolov5_row(50, 60, 20, 40, 0.5, [1.0, 0.0, 0.0]),  # person 0.5 -> (40, 40, 60, 80)
    yolov5_row(0, 0, 0, 0, 0.0, [0.0, 0.0, 0.0]),  # padding row
    yolov5_row(0, 0, 0, 0, 0.0, [0.0, 0.0, 0.0]),
    yolov5_row(0, 0, 0, 0, 0.0, [0.0, 0.0, 0.0]),
    yolov5_row(0, 0, 0, 0, 0.0, [0.0, 0.0, 0.0]),
]
EXPECTED = [
    ([[160, 100, 240, 140], [160, 100, 240, 140]], [0.72, 0.63], [1, 2]),
    ([[40, 40, 60, 80]], [0.5], [0]),
]


def as_yolov8(v5: np.ndarray) -> np.ndarray:
    """The same boxes in the yolov8 layout: scores are objectness × probability, classes on axis 1."""
    scores = v5[:, :, 5:] * v5[:, :, 4:5]
    return np.concatenate([v5[:, :, :4], scores], axis=2).transpose(0, 2, 1).copy()


def decode(outputs, layout, letterboxes=(WIDE, SQUARE), **overrides):
    options = {"conf_threshold": 0.25, "iou_threshold": 0.45, "class_ids_keep": None, "max_detections": 100}
    options.update(overrides)
    return decode_batch(outputs, spec(layout), list(letterboxes), **options)


def assert_frame(dets, boxes, scores, class_ids):
    np.testing.assert_allclose(dets.xyxy, np.array(boxes, np.float32).reshape(-1, 4), atol=1e-4)
    np.testing.assert_allclose(dets.scores, scores, atol=1e-6)
    np.testing.assert_array_equal(dets.class_ids, class_ids)
    assert dets.xyxy.dtype == np.float32 and dets.scores.dtype == np.float32 and dets.class_ids.dtype == np.int32
    np.testing.assert_array_equal(dets.track_ids, -1)


@pytest.mark.parametrize("layout", ["yolov5", "yolov8"])
def test_decoding_a_batch_gives_frame_pixel_boxes_after_class_aware_nms(layout):
    raw = np.array([FRAME0_V5, FRAME1_V5], np.float32)
    outputs = run_identity_model(raw if layout == "yolov5" else as_yolov8(raw))
    result = decode(outputs, layout)
    assert len(result) == 2
    for dets, expected in zip(result, EXPECTED, strict=True):
        assert_frame(dets, *expected)


def nms_layout_batch() -> np.ndarray:
    out = np.zeros((2, 4, 6), np.float32)
    out[0, 0] = [80, 90, 120, 110, 0.72, 1]  # -> (160, 100, 240, 140)
    out[0, 1] = [80, 90, 120, 110, 0.20, 2]  # below the threshold
    out[1, 0] = [40, 40, 60, 80, 0.5, 0]
    return out


def test_decoding_the_nms_layout_only_thresholds_and_maps_boxes():
    result = decode(run_constant_model(nms_layout_batch()), "nms")
    assert_frame(result[0], [[160, 100, 240, 140]], [0.72], [1])
    assert_frame(result[1], [[40, 40, 60, 80]], [0.5], [0])


@pytest.mark.parametrize(
    ("keep", "expected_classes"),
    [([1], [1]), ([2], [2]), ([0], []), ([0, 1, 2], [1, 2]), ([], [])],
)
def test_class_filter_keeps_only_the_listed_class_ids(keep, expected_classes):
    raw = np.array([FRAME0_V5], np.float32)
    (dets,) = decode(run_identity_model(raw), "yolov5", [WIDE], class_ids_keep=np.array(keep, np.int32))
    np.testing.assert_array_equal(dets.class_ids, expected_classes)


def test_a_box_whose_best_class_is_filtered_out_is_not_relabelled():
    raw = np.array([[yolov5_row(100, 100, 40, 20, 0.9, [0.3, 0.6, 0.0])]], np.float32)
    (dets,) = decode(run_identity_model(raw), "yolov5", [WIDE], class_ids_keep=np.array([0]))
    assert len(dets) == 0


@pytest.mark.parametrize(
    ("box_input_cxcywh", "expected_frame_xyxy"),
    [
        ((10, 100, 40, 20), [[0, 100, 60, 140]]),  # pokes out on the left: clipped at x = 0
        ((310, 270, 40, 20), [[580, 440, 640, 480]]),  # pokes out bottom-right: clipped to 640x480
        ((100, 20, 40, 20), []),  # entirely in the top padding: zero height after clipping, dropped
        ((100, 100, 0.2, 20), []),  # 0.4 px wide in the frame: too thin, dropped
        ((100, 100, 40, 0), []),  # zero height, dropped
    ],
)
def test_boxes_are_clipped_to_the_frame_and_degenerate_ones_dropped(box_input_cxcywh, expected_frame_xyxy):
    raw = np.array([[yolov5_row(*box_input_cxcywh, 0.9, [1.0, 0.0, 0.0])]], np.float32)
    (dets,) = decode(run_identity_model(raw), "yolov5", [WIDE])
    np.testing.assert_allclose(dets.xyxy, np.array(expected_frame_xyxy, np.float32).reshape(-1, 4))
    assert np.all(dets.xyxy[:, 0] < dets.xyxy[:, 2]) and np.all(dets.xyxy[:, 1] < dets.xyxy[:, 3])


def test_max_detections_keeps_the_best_scores():
    rows = [yolov5_row(20 + 30 * i, 100, 20, 20, 0.3 + 0.05 * i, [1.0, 0.0, 0.0]) for i in range(10)]
    (dets,) = decode(run_identity_model(np.array([rows], np.float32)), "yolov5", [WIDE], max_detections=3)
    np.testing.assert_allclose(dets.scores, [0.75, 0.70, 0.65], atol=1e-6)


def test_results_do_not_share_memory_with_the_reused_engine_buffer():
    raw = np.array([FRAME0_V5, FRAME1_V5], np.float32)
    result = decode([raw], "yolov5")
    before = [d.xyxy.copy() for d in result]
    raw[:] = 0  # the engine reuses its output buffer for the next batch
    for dets, saved in zip(result, before, strict=True):
        assert not np.shares_memory(dets.xyxy, raw) and not np.shares_memory(dets.scores, raw)
        np.testing.assert_array_equal(dets.xyxy, saved)


def test_padded_batch_rows_are_ignored_and_a_short_batch_is_an_error():
    raw = np.array([FRAME0_V5, FRAME1_V5, FRAME1_V5], np.float32)
    assert len(decode([raw], "yolov5")) == 2
    with pytest.raises(ModelError, match="smaller than 3 frames"):
        decode([raw[:2]], "yolov5", [WIDE, SQUARE, SQUARE])


def test_half_precision_outputs_decode_like_single_precision():
    raw = np.array([FRAME0_V5, FRAME1_V5], np.float32)
    full = decode([raw], "yolov5")
    half = decode([raw.astype(np.float16)], "yolov5")
    for a, b in zip(full, half, strict=True):
        np.testing.assert_allclose(a.xyxy, b.xyxy, atol=0.5)
        np.testing.assert_array_equal(a.class_ids, b.class_ids)


def test_an_empty_batch_output_gives_empty_detections():
    result = decode([np.zeros((2, 100, 8), np.float32)], "yolov5")
    assert [len(d) for d in result] == [0, 0]


@pytest.mark.parametrize(
    ("layout", "shape", "fits"),
    [
        ("yolov5", (1, 6300, 8), True),
        ("yolov5", ("batch", "boxes", 8), True),
        ("yolov5", (1, 6300, 85), False),
        ("yolov5", (1, 8, 6300), False),
        ("yolov8", (1, 7, 8400), True),
        ("yolov8", (None, 7, None), True),
        ("yolov8", (1, 8400, 7), False),
        ("nms", (1, 100, 6), True),
        ("nms", (1, 100, 7), False),
        ("nms", (1, 600), False),
    ],
)
def test_check_layout_accepts_fitting_shapes_and_names_expected_vs_actual(layout, shape, fits):
    if fits:
        check_layout(spec(layout), [shape])
        return
    with pytest.raises(ModelError) as error:
        check_layout(spec(layout), [shape])
    message = str(error.value)
    assert "expected" in message and "[" + ", ".join(str(d) for d in shape) + "]" in message
    assert "\n" not in message


def test_decode_refuses_an_output_that_does_not_fit_the_layout():
    with pytest.raises(ModelError, match="does not fit layout yolov8"):
        decode([np.zeros((2, 100, 8), np.float32)], "yolov8")
