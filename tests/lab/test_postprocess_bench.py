"""lab/postprocess_bench.py: decode + NMS of a crowded synthetic batch stays far below a batch's inference time."""

from __future__ import annotations

import pytest

from lab.postprocess_bench import bench_postprocess


@pytest.mark.parametrize("layout", ["yolov5", "yolov8"])
def test_postprocess_benchmark_of_a_crowded_batch_of_8_stays_well_under_inference_time(layout):
    result = bench_postprocess(layout=layout, batch=8, candidates_per_frame=2000, repeats=5)
    assert result["detections_per_frame"] > 10
    assert result["median_ms"] < 100.0, result
