"""docs/configuration.md is generated from app/config.py and must not drift from it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_script

SCRIPT = ROOT / "scripts" / "gen_config_docs.py"


@pytest.fixture(scope="module")
def gen():
    return load_script("gen_config_docs")


def test_the_committed_configuration_doc_is_up_to_date(gen):
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen.render(), "run: python scripts/gen_config_docs.py"


def test_every_config_field_has_a_meaning(gen):
    missing = [path for path, field in gen.all_fields() if not gen.meaning(path, field)]
    assert not missing, f"add a Field(description=...) in app/config.py (or a NOTES entry) for {missing}"


def test_notes_only_name_fields_that_exist(gen):
    paths = {path for path, _ in gen.all_fields()}
    assert set(gen.NOTES) <= paths, set(gen.NOTES) - paths


def test_every_field_appears_in_its_section(gen):
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for path, _ in gen.all_fields():
        parent, _, name = path.rpartition(".")
        heading = f"## `{parent}`" if parent else "## Top level"
        section = doc.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        assert f"| `{name}` |" in section, path


def test_check_mode_exits_0_when_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
