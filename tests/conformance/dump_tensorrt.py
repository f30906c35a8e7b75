"""Dump the real TensorRT Python API of a lean bindings wheel as JSON (run in a subprocess by real_bindings.py).

Usage: ``python dump_tensorrt.py BINDINGS_DIR LIBS_DIR`` (unpacked wheels). Prints
``{"version", "classes": {name: {member: {"kind", "params"?}}}, "enums": {name: [members]}, "functions": [...]}``
where ``params`` lists, per overload, the parameter names of the pybind11 signature (``self`` left out).
A subprocess, so that TensorRT 10 and 11 never share an interpreter.
"""

from __future__ import annotations

import inspect
import json
import re
import sys


def split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def signatures(doc: str, name: str) -> list[list[str]]:
    found = []
    for line in doc.splitlines():
        match = re.match(rf"^\s*(?:\d+\.\s+)?{re.escape(name)}\((.*)\)\s*->", line)
        if not match:
            continue
        params = [p.split(":")[0].split("=")[0].strip() for p in split_top(match.group(1))]
        found.append([p for p in params if p and p != "self"])
    return found


def describe(cls: type) -> dict[str, dict]:
    members: dict[str, dict] = {}
    for attr in dir(cls):
        if attr.startswith("__") and attr != "__init__":
            continue
        static = inspect.getattr_static(cls, attr, None)
        if isinstance(static, property):
            members[attr] = {"kind": "property", "writable": static.fset is not None}
            continue
        try:
            value = getattr(cls, attr)
        except Exception:  # a member that cannot be read on the class is still a member
            members[attr] = {"kind": "value"}
            continue
        if isinstance(value, type):
            members[attr] = {"kind": "class"}
        elif callable(value):
            members[attr] = {"kind": "method", "params": signatures(value.__doc__ or "", attr)}
        else:
            members[attr] = {"kind": "value"}
    return members


def main() -> None:
    sys.path[:0] = sys.argv[1:]
    import tensorrt_lean_bindings as trt

    out: dict = {"version": trt.__version__, "classes": {}, "enums": {}, "functions": []}
    todo = [(name, getattr(trt, name)) for name in dir(trt) if not name.startswith("_")]
    while todo:
        name, obj = todo.pop()
        if isinstance(obj, type):
            out["classes"][name] = describe(obj)
            members = getattr(obj, "__members__", None)
            if isinstance(members, dict):
                out["enums"][name] = sorted(members)
            todo += [(f"{name}.{a}", getattr(obj, a)) for a in dir(obj)
                     if not a.startswith("_") and isinstance(getattr(obj, a, None), type)
                     and getattr(obj, a) is not obj]
        elif callable(obj) and "." not in name:
            out["functions"].append(name)
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
