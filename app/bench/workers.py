"""Building ``detstream run`` command lines and config files for the worker subprocesses.

``--set KEY=VALUE`` overrides from the bench command line land here: dotted
paths into the config (``engine.max_wait_ms=5``, ``publish.encoding=msgpack``);
``source.KEY`` applies to every source (``source.max_staleness_ms=300``).
Values are parsed as YAML scalars (``5`` is an int, ``true`` a bool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["engine.max_wait_ms=5"]`` → ``{"engine.max_wait_ms": 5}``; malformed items raise ValueError."""
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ValueError(f"--set {item!r}: expected SECTION.KEY=VALUE (e.g. engine.max_wait_ms=5)")
        parsed[key.strip()] = yaml.safe_load(value)
    return parsed


def apply_overrides(tree: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set each dotted path in a config tree (``source.*`` on every source); returns the tree."""
    for key, value in overrides.items():
        section, _, rest = key.partition(".")
        targets = tree.get("sources", []) if section == "source" else [tree.setdefault(section, {})]
        for target in targets:
            node = target
            parts = rest.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
    return tree


def engine_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """The ``engine.*`` overrides as keyword arguments for :class:`app.config.EngineConfig`."""
    return {k.removeprefix("engine."): v for k, v in overrides.items() if k.startswith("engine.")}


def base_tree(model_path: Path, backend: str, endpoint: str, overrides: dict[str, Any],
              sources: list[dict[str, Any]]) -> dict[str, Any]:
    tree = {"sources": sources, "model": {"path": str(model_path)}, "engine": {"backend": backend},
            "publish": {"endpoint": endpoint}}
    return apply_overrides(tree, overrides)


def write_config(tree: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path
