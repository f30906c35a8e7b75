"""lab/analytics_bench.py: zones and lines stay within their CPU budget per frame (0.3 ms, 3x slack for busy CI)."""

from __future__ import annotations

from lab.analytics_bench import measure


def test_two_zones_and_two_lines_on_eight_cameras_cost_well_under_a_millisecond_per_frame():
    result = measure(cameras=8, people=12, frames=800)
    assert result["events"] > 100  # the walkers really enter, leave and cross
    assert result["analytics_ms_per_frame"] < 0.9, result
