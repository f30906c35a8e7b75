"""What an interrupted fetch leaves is swept, and nothing else: only names the store makes, only older ones."""

from __future__ import annotations

import os
import time

import pytest

from app.models.store.files import atomic_output, scratch_dir, sweep_stale
from app.stop import at_forced_exit, run_forced_exit_cleanups


def age(path, seconds: float = 3600) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_sweep_removes_old_scratch_folders_and_temporary_files_only(tmp_path):
    cache, models = tmp_path / "cache", tmp_path / "models"
    cache.mkdir()
    models.mkdir()
    target = models / "yolov3-tiny.onnx"
    stale = [cache / "darknet-ab12_x9z", models / ".yolov3-tiny.onnx.k3j_9aQz.tmp"]
    stale[0].mkdir()
    (stale[0] / "yolov3-tiny.weights").write_bytes(b"w" * 1000)
    stale[1].write_bytes(b"partial")
    kept = [cache / "darknet-notes", cache / "darknet-ab12_x9z.bak", models / ".yolov3-tiny.onnx.mine.tmp",
            models / "yolov3-tiny.onnx.k3j_9aQz.tmp", models / ".other.onnx.k3j_9aQz.tmp", cache / "darknet-fresh123"]
    for path in kept:
        if "darknet" in path.name and "." not in path.name:
            path.mkdir()
        else:
            path.write_text("the user's")
    for path in stale + kept[:-1]:
        age(path)
    removed = sweep_stale(scratch=[(cache, "darknet-")], targets=[target])
    assert sorted(removed) == sorted(stale)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept), "a file the store did not make, or one newer than this process, stays"


def test_scratch_dir_and_atomic_output_leave_nothing_on_an_exception(tmp_path):
    with pytest.raises(KeyboardInterrupt), scratch_dir(tmp_path, "darknet-") as scratch:
        (scratch / "w").write_bytes(b"x")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), atomic_output(tmp_path / "m.onnx") as tmp:
        tmp.write_bytes(b"x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_forced_exit_removes_the_work_in_progress(tmp_path):
    with pytest.raises(InterruptedError), scratch_dir(tmp_path, "darknet-") as scratch, \
            atomic_output(tmp_path / "m.onnx") as tmp:
        tmp.write_bytes(b"x")
        run_forced_exit_cleanups()  # what the second signal's handler does before os._exit
        assert not scratch.exists() and not tmp.exists()
        raise InterruptedError  # os._exit would end the process here
    removed = []
    forget = at_forced_exit(lambda: removed.append(1))
    forget()
    run_forced_exit_cleanups()
    assert removed == [], "a finished piece of work is no longer cleaned up at exit"
