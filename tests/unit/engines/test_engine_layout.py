"""app/engines keeps one room per backend: no backend imports the other, no import cycles, lazy imports only for
optional third-party packages, and callers ask the engine instead of reading its backend name."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENGINES = ROOT / "app" / "engines"
BACKENDS = ("app.engines.onnxruntime", "app.engines.tensorrt", "app.engines.openvino")
OPTIONAL = {"tensorrt", "onnxruntime", "onnx", "cv2", "cuda", "openvino"}
"""Third-party packages an engine module may import inside a function: optional, or heavy and used on one path."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ENGINES.rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in ``path``; ``from X import y`` gives X.y when that
    is a module of app/engines, else X."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub if sub in MODULES else node.module, id(node) in top))
    return found


def test_the_scan_sees_both_backends_and_the_shared_rooms() -> None:
    for name in (*BACKENDS, "app.engines.openvino.engine",
                 "app.engines.tensorrt.engine", "app.engines.onnxruntime.engine", "app.engines.base",
                 "app.engines.shapes", "app.engines.cuda.device", "app.engines.cuda.host_memory",
                 "app.engines.frame_workers"):
        assert name in MODULES, name


@pytest.mark.parametrize(("backend", "other"), list(itertools.permutations(BACKENDS, 2)))
def test_a_backend_never_imports_the_other_backend_or_the_registry(backend: str, other: str) -> None:
    own = [name for name in MODULES if name == backend or name.startswith(backend + ".")]
    assert own
    for name in own:
        for target, _ in imports(MODULES[name]):
            assert not (target == other or target.startswith(other + ".")), f"{name} imports {target}"
            assert target != "app.engines", f"{name} imports the registry"


@pytest.mark.parametrize("shared", ["app.engines.base", "app.engines.shapes", "app.engines.cuda",
                                    "app.engines.frame_workers"])
def test_the_shared_rooms_import_no_backend(shared: str) -> None:
    for name in (n for n in MODULES if n == shared or n.startswith(shared + ".")):
        for target, _ in imports(MODULES[name]):
            assert not target.startswith(BACKENDS), f"{name} imports {target}"


def test_app_engines_has_no_import_cycle() -> None:
    graph = {name: {t for t, top in imports(path) if top and t in MODULES and t != name}
             for name, path in MODULES.items()}
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            assert state.get(target) != "open", " -> ".join([*trail, node, target])
            if target not in state:
                visit(target, [*trail, node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_lazy_imports_are_only_of_optional_third_party_packages() -> None:
    for name, path in MODULES.items():
        for target, top in imports(path):
            if not top:
                assert target.split(".")[0] in OPTIONAL, f"{name} imports {target} inside a function"


def test_the_pipeline_asks_the_engine_for_its_allocator_instead_of_reading_the_backend_name() -> None:
    source = (ROOT / "app" / "pipeline.py").read_text()
    assert "host_allocator()" in source
    assert ".startswith(\"tensorrt" not in source and ".startswith('tensorrt" not in source
