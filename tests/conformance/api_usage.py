"""What detstream's TensorRT and CUDA code uses of the real APIs, collected by reading the code (``ast``).

Pragmatic but real: a variable's TensorRT class is known from its name (:data:`TRT_VARIABLES`, the names
the adapter and builder use consistently), and every ``trt.X``/``trt.X.Y`` access, every attribute read or
written and every method called (with its keyword names and positional count) on such a variable is one
:class:`Use`. The same for ``cuda.bindings.runtime`` in :mod:`app.engines.cuda.device` (``self._rt.X`` and
``cudart.X``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRT_SOURCES = (ROOT / "app/engines/tensorrt/adapter.py", ROOT / "app/engines/tensorrt/build.py")
CUDA_SOURCES = (ROOT / "app/engines/cuda/device.py",)
MODULE = "<module>"

TRT_VARIABLES = {
    "builder": "Builder", "network": "INetworkDefinition", "parser": "OnnxParser", "config": "IBuilderConfig",
    "profile": "IOptimizationProfile", "serialized": "IHostMemory", "engine": "ICudaEngine",
    "self._engine": "ICudaEngine", "context": "IExecutionContext", "self._context": "IExecutionContext",
    "self._runtime": "Runtime", "severity": "ILogger.Severity", "trt": MODULE,
}
CUDA_VARIABLES = {"self._rt": MODULE, "cudart": MODULE}


@dataclass(frozen=True)
class Use:
    """``owner.member`` as used at ``where``; for a call, its positional count and keyword names."""

    owner: str
    member: str
    where: str
    call: bool = False
    positional: int = 0
    keywords: tuple[str, ...] = ()


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def uses(paths: tuple[Path, ...], variables: dict[str, str]) -> list[Use]:
    """Every use of a variable of :data:`TRT_VARIABLES`/:data:`CUDA_VARIABLES` (or of its attributes) in ``paths``."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain = _dotted(node.value)
            if chain is None:
                continue
            head, _, rest = chain.partition(".")
            if chain in variables:
                owner = variables[chain]
            elif variables.get(head) == MODULE and rest and "." not in rest:
                owner = rest  # trt.X.member: a member of class or enum X
            elif chain.startswith("self._rt.") and chain.count(".") == 2:
                owner = chain.split(".")[-1]  # self._rt.X.member
            else:
                continue
            where = f"{path.name}:{node.lineno}"
            call = calls.get(id(node))
            if call is None:
                found.append(Use(owner, node.attr, where))
            else:
                keywords = tuple(k.arg for k in call.keywords if k.arg)
                found.append(Use(owner, node.attr, where, True, len(call.args), keywords))
    return found
