"""Detection agreement: held-out frames never overlap calibration, and the F1 of matched detections."""

from __future__ import annotations

import numpy as np
import pytest

from app.models.quantization.agreement import f1_agreement, held_out_indices
from app.models.quantization.calibration import evenly_spaced
from app.types import Detections


@pytest.mark.parametrize(("total", "calibration", "count"), [(795, 100, 60), (795, 20, 10), (250, 100, 60), (30, 5, 3)])
def test_held_out_frames_lie_between_calibration_frames_and_never_on_one(total, calibration, count):
    held = held_out_indices(total, calibration, count)
    assert held and len(held) <= count and held == sorted(set(held))
    assert not set(held) & set(evenly_spaced(total, calibration))
    assert all(0 <= i < total for i in held)


def dets(*rows: tuple[float, float, float, float, float, int]) -> Detections:
    array = np.array(rows, np.float32).reshape(-1, 6)
    return Detections(array[:, :4], array[:, 4], array[:, 5].astype(np.int32))


@pytest.mark.parametrize(("reference", "candidate", "f1", "precision", "recall"), [
    ([dets((0, 0, 10, 10, .9, 0))], [dets((0, 0, 10, 10, .8, 0))], 1.0, 1.0, 1.0),
    ([dets((0, 0, 10, 10, .9, 0))], [dets((0, 0, 10, 10, .8, 1))], 0.0, 0.0, 0.0),      # other class
    ([dets((0, 0, 10, 10, .9, 0))], [dets((5, 0, 15, 10, .8, 0))], 0.0, 0.0, 0.0),      # IoU 1/3
    ([dets((0, 0, 10, 10, .9, 0))], [dets((1, 0, 11, 10, .8, 0))], 1.0, 1.0, 1.0),      # IoU 0.82
    ([dets((0, 0, 10, 10, .9, 0), (20, 20, 30, 30, .9, 0))], [dets((0, 0, 10, 10, .8, 0))], 0.6667, 1.0, 0.5),
    ([dets((0, 0, 10, 10, .9, 0))], [dets((0, 0, 10, 10, .8, 0), (0, 0, 10, 10, .7, 0))], 0.6667, 0.5, 1.0),
    ([dets()], [dets()], 1.0, 1.0, 1.0),
])
def test_f1_agreement_matches_one_to_one_by_class_and_iou(reference, candidate, f1, precision, recall):
    result = f1_agreement(reference, candidate)
    assert (result.f1, result.precision, result.recall) == (f1, precision, recall)


def test_f1_agreement_takes_the_match_iou_and_reports_its_counts():
    reference, candidate = [dets((0, 0, 10, 10, .9, 0)), dets()], [dets((5, 0, 15, 10, .8, 0)), dets()]  # IoU 1/3
    assert f1_agreement(reference, candidate).matched == 0
    result = f1_agreement(reference, candidate, match_iou=0.3)
    assert result.as_dict() == {"f1": 1.0, "precision": 1.0, "recall": 1.0, "reference_detections": 1,
                                "candidate_detections": 1, "frames": 2}
