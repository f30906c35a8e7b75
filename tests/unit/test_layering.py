"""The product never depends on the lab, the tests or the scripts: ``app/`` imports none of them."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

FORBIDDEN = ("lab", "tests", "scripts")
MODULES = sorted((ROOT / "app").rglob("*.py"))


def imported_roots(source: str) -> set[str]:
    """The top-level package of every absolute import in ``source`` (relative imports stay inside ``app``)."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_app_module_imports_lab_tests_or_scripts():
    assert len(MODULES) > 50  # the walk found the package
    offenders = {str(path.relative_to(ROOT)): sorted(imported_roots(path.read_text()) & set(FORBIDDEN))
                 for path in MODULES}
    assert {path: roots for path, roots in offenders.items() if roots} == {}


@pytest.mark.parametrize("source", ["import lab.soak", "from lab import soak", "from tests.conftest import ROOT",
                                    "def f():\n    import scripts.gen_config_docs"])
def test_the_check_sees_every_form_of_import(source: str):
    assert imported_roots(source) & set(FORBIDDEN)


def test_the_check_leaves_relative_and_app_imports_alone():
    assert not imported_roots("from . import lab\nfrom .tests import x\nimport app.lab\nfrom app import tests\n") & set(
        FORBIDDEN)
