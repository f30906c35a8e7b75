"""scripts/decode_cost.py, the floor of file mode's non-inference share, on the real bikes clip."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def decode_cost():
    return load_script("decode_cost")


def test_each_step_adds_its_work(decode_cost, bikes: Path) -> None:
    """Decoding alone costs something, and RGB plus the letterbox cost more on top, with either threading."""
    for threading in decode_cost.THREADING.values():
        decode_only = decode_cost.one_pass(bikes, 0, threading)
        everything = decode_cost.one_pass(bikes, 2, threading)
        assert 0 < decode_only < 50  # ms per 640×272 frame: a real decode, not an empty loop
        assert everything > decode_only


def test_prints_the_machine_and_a_row_per_step(decode_cost, bikes: Path, capsys) -> None:
    assert decode_cost.main(["--clip", str(bikes), "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "Machine:" in out
    for step in decode_cost.STEPS:
        assert step in out


def test_an_unknown_clip_is_named(decode_cost) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-clip"):
        decode_cost.main(["--clip", "no-such-clip.mp4"])
