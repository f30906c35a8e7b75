"""``detstream bench --engines``: the engine/precision pairs it measures side by side."""

from __future__ import annotations

import pytest

from app.bench import build_parser, make_plan, parse_engines


def test_pairs_are_backend_and_precision_with_auto_for_a_bare_name() -> None:
    assert parse_engines("onnxruntime:fp32, openvino:fp32,auto,openvino:int8") == [
        ("onnxruntime", "fp32"), ("openvino", "fp32"), ("auto", "auto"), ("openvino", "int8")]


@pytest.mark.parametrize("text", ["cuda:fp32", "openvino:fp8", ",", ""])
def test_a_bad_item_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="--engines"):
        parse_engines(text)


def test_the_plan_carries_the_pairs_and_quick_still_applies() -> None:
    plan = make_plan(build_parser().parse_args(["--quick", "--engines", "onnxruntime:fp32,auto"]))
    assert plan.engines == [("onnxruntime", "fp32"), ("auto", "auto")] and plan.repeats == 1
    assert make_plan(build_parser().parse_args(["--quick"])).engines is None
