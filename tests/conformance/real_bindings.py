"""The real TensorRT bindings, fetched from PyPI into detstream's download cache and read without a GPU.

* Lean runtime wheels (``tensorrt-lean-cu13-*`` 11.x, ``tensorrt-lean-cu12-*`` 10.x) import without a GPU:
  :func:`lean_api` unpacks them (wheels are zip files) under the cache, never into the venv, and dumps the
  real classes, members, enum members and pybind11 parameter names as JSON from a subprocess
  (``dump_tensorrt.py``), so the two majors never meet in one interpreter.
* The full bindings (``tensorrt-cu13-bindings``, ``tensorrt-cu12-bindings``) cannot be imported without
  the full library, but their ``.so`` holds the builder side's names, keywords and docstrings as text:
  :func:`full_strings` reads them as bytes.

Everything is cached: ``$DETSTREAM_CACHE`` (or ``~/.cache/detstream``) ``/wheels`` holds the wheels,
``/conformance`` the unpacked trees and dumps. A fetch that fails because PyPI is unreachable raises
:class:`Unreachable` (the tests skip, saying so); any other failure is an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

LEAN = {
    11: ("tensorrt-lean-cu13-libs==11.4.0.106", "tensorrt-lean-cu13-bindings==11.4.0.106"),
    10: ("tensorrt-lean-cu12-libs==10.16.1.11", "tensorrt-lean-cu12-bindings==10.16.1.11"),
}
FULL = {11: "tensorrt-cu13-bindings==11.4.0.106", 10: "tensorrt-cu12-bindings==10.13.3.9"}
PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64")


class Unreachable(Exception):
    """PyPI could not be reached (the conformance tests skip with this reason)."""


def cache_root() -> Path:
    return Path(os.environ.get("DETSTREAM_CACHE") or "~/.cache/detstream").expanduser()


def wheel(requirement: str) -> Path:
    """The wheel for ``name==version``, from the cache or downloaded into it (``pip download --no-deps``)."""
    name, version = requirement.split("==")
    folder = cache_root() / "wheels"
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{stem}*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *PLATFORM,
                           "--dest", str(folder), requirement], capture_output=True, text=True, timeout=600)
    found = sorted(folder.glob(f"{stem}*.whl"))
    if done.returncode != 0 or not found:
        text = (done.stderr + done.stdout).strip()
        index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
        if not _reachable(index):
            raise Unreachable(f"cannot reach {index} to download {requirement}")
        raise RuntimeError(f"pip download {requirement} failed although {index} answers: {text}")
    return found[0]


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status < 500
    except (OSError, ValueError):
        return False


def unpacked(requirement: str) -> Path:
    """The wheel's contents, unpacked once under ``<cache>/conformance/<wheel name>``."""
    path = wheel(requirement)
    target = cache_root() / "conformance" / path.stem
    marker = target / ".unpacked"
    if not marker.exists():
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(path) as archive:
            archive.extractall(partial)
        (partial / ".unpacked").touch()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)  # whole or not at all, also with two test sessions at once
    return target


def lean_api(major: int) -> dict:
    """The real lean runtime API of TensorRT ``major`` (see ``dump_tensorrt.py``), cached as JSON."""
    libs, bindings = (unpacked(r) for r in LEAN[major])
    dump = bindings / "api.json"
    if not dump.exists():
        done = subprocess.run([sys.executable, str(HERE / "dump_tensorrt.py"), str(bindings), str(libs)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
        if done.returncode != 0:
            raise RuntimeError(f"importing tensorrt_lean_bindings {major} failed: {done.stderr}")
        partial = dump.with_name(f".{dump.name}.{os.getpid()}")
        partial.write_text(done.stdout)
        os.replace(partial, dump)  # another test session may be reading it
    return json.loads(dump.read_text())


class BindingNames:
    """The C strings of a bindings ``.so``: ``name in names`` when ``name`` ends one of them.

    "Ends" rather than "is": the linker stores a string that is the tail of another only once
    (``Builder`` inside ``IBuilder``), so an exact match would miss real names.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name.encode() + b"\0") in self._data


def full_strings(major: int) -> BindingNames:
    """The names, keywords and docstrings in the full bindings' ``tensorrt.so`` of TensorRT ``major``."""
    root = unpacked(FULL[major])
    (so,) = root.glob("tensorrt_bindings/tensorrt*.so")
    return BindingNames(so.read_bytes())
