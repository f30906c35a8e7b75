"""The bad-input corpus end to end (tests/integration/corpus.py): every mistake ends in one clear line.

Source cases run in groups, to keep time down: ONE ``detstream run`` with
every broken file beside a good 20-frame clip, and ONE ``detstream run
--duration`` with every unreachable or wrong network source beside the good
clip and a good camera. Each bad source must end (or keep retrying) with its
own one-line reason, and the good sources must publish every frame as if the
bad ones were not there. Configuration, model and endpoint mistakes are fast
fatal errors: exit 2, exactly one ``detstream: error:`` line, no traceback.
"""

from __future__ import annotations

import itertools
import re
import socket
import subprocess
import threading
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import Collector, detstream, free_port
from tests.integration.corpus import (
    FATAL_CASES,
    FILE_CASES,
    GOOD_FRAMES,
    NET_CASES,
    Context,
    FatalCase,
    SourceCase,
    good_clip,
    timestamp_jumps,
)
from tests.integration.rtsp import GarbageServer, RtspServer, dead_port, gst_rtsp_missing

ERROR_PREFIX = "detstream: error:"
NET_RUN_S = 8.0


@dataclass
class GroupRun:
    """One ``detstream run`` over many sources: its result and every message published."""

    result: subprocess.CompletedProcess
    collector: Collector

    def errors(self) -> list[str]:
        return [line for line in self.result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]

    def seqs(self, stream: str) -> list[int]:
        return [d["seq"] for d in self.collector.detections(stream)]


def params(cases: list[SourceCase] | list[FatalCase]) -> list:
    """Cases as pytest params; a case with a known bug is a strict xfail naming it."""
    marks = lambda case: [pytest.mark.xfail(strict=True, reason=case.bug)] if case.bug else []  # noqa: E731
    return [pytest.param(case, id=case.id, marks=marks(case)) for case in cases]


def run_group(sources: dict[str, str], *options: str, timeout_s: float = 180) -> GroupRun:
    port = free_port()
    collector = Collector(f"tcp://127.0.0.1:{port}").start()
    args = ["run", "--publish", f"tcp://127.0.0.1:{port}", "--max-batch", "8", "--no-progress", *options]
    for stream_id, url in sources.items():
        args += ["--source", f"{stream_id}={url}"]
    try:
        result = detstream(*args, timeout_s=timeout_s)
    finally:
        collector.stop()
    return GroupRun(result, collector)


def assert_good_clip_untouched(run: GroupRun, stream: str = "good") -> None:
    assert run.seqs(stream) == list(range(GOOD_FRAMES)), "the good clip lost frames beside the bad sources"
    assert all(d["dropped_before"] == 0 for d in run.collector.detections(stream))
    final = run.collector.statuses(stream)[-1]
    assert final["state"] == "ended" and final["reason"].endswith("good.mp4: end of file"), final


def assert_contiguous_within(run: GroupRun, case: SourceCase) -> None:
    seqs = run.seqs(case.id)
    assert seqs == list(range(len(seqs))), f"{case.id}: seqs not 0..n-1: {seqs[:20]}"
    low, high = case.frames
    assert low <= len(seqs) and (high is None or len(seqs) <= high), f"{case.id}: {len(seqs)} frames published"


# -- files: one run, every broken file beside a good clip -----------------------------------------------------------

@pytest.fixture(scope="module")
def file_run(tmp_path_factory, default_model) -> GroupRun:
    ctx = Context(tmp_path_factory.mktemp("corpus_files"))
    sources = {case.id: case.build(ctx) for case in FILE_CASES}
    sources["good"] = str(good_clip(ctx))
    return run_group(sources)


@pytest.mark.parametrize("case", params(FILE_CASES))
def test_a_bad_file_ends_with_its_one_line_reason_after_its_decodable_frames(file_run, case):
    statuses = file_run.collector.statuses(case.id)
    assert statuses, f"{case.id}: no status published"
    final = statuses[-1]
    assert final["state"] == case.state, final
    assert re.search(case.reason, final["reason"]) and "\n" not in final["reason"], final["reason"]
    first_terminal = next(i for i, s in enumerate(statuses) if s["state"] in ("ended", "failed"))
    after = {(s["state"], s["reason"]) for s in statuses[first_terminal:]}
    assert after == {(final["state"], final["reason"])}, "a terminal status is final (heartbeats may repeat it)"
    assert_contiguous_within(file_run, case)
    assert final["frames"] == len(file_run.seqs(case.id))
    if case.state == "failed":
        lines = [e for e in file_run.errors() if e.startswith(f"{ERROR_PREFIX} source {case.id!r} failed:")]
        assert len(lines) == 1 and re.search(case.reason, lines[0]), file_run.errors()


def test_the_good_clip_beside_the_broken_files_publishes_every_frame(file_run):
    assert_good_clip_untouched(file_run)


def test_the_file_run_exits_1_with_one_error_line_per_failed_source_and_no_traceback(file_run):
    result = file_run.result
    failed = sorted(case.id for case in FILE_CASES if case.state == "failed")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    named = sorted(re.match(rf"{ERROR_PREFIX} source '([^']+)' failed: ", e).group(1) for e in file_run.errors())
    assert named == failed


def test_the_terminal_status_of_a_partly_decoded_file_follows_its_last_detection(file_run):
    messages = file_run.collector.messages
    last_det = max(i for i, (t, _) in enumerate(messages) if t == "det/truncated/")
    failed_at = min(i for i, (t, p) in enumerate(messages) if t == "status/truncated/" and p["state"] == "failed")
    assert failed_at > last_det


def test_corrupted_nal_units_are_counted_as_damage(file_run):
    assert re.search(r"corrupt_nal: \d+ damaged frames", file_run.result.stderr)


# -- network: one timed run, every wrong or dead URL beside the good clip and a good camera -----------------------

@pytest.fixture(scope="module")
def camera_server() -> RtspServer:
    """The RTSP server of the network group (module scope: one run uses it)."""
    reason = gst_rtsp_missing()
    if reason:
        pytest.skip(reason)
    server = RtspServer({"/cam": "pattern:320x240@5"}, user="viewer", password="right").start()
    yield server
    server.kill()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        return


@pytest.fixture(scope="module")
def net_run(tmp_path_factory, default_model, camera_server) -> GroupRun:
    root = tmp_path_factory.mktemp("corpus_net")
    camera = camera_server
    garbage = GarbageServer()
    http = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=http.serve_forever, name="test.http", daemon=True).start()
    try:
        ctx = Context(root, rtsp_port=camera.port, garbage_port=garbage.port, dead_port=dead_port(),
                      http_base=f"http://127.0.0.1:{http.server_address[1]}")
        sources = {case.id: case.build(ctx) for case in NET_CASES}
        sources["good"] = str(good_clip(ctx))
        sources["camera"] = camera.url("/cam", "viewer", "right")
        return run_group(sources, "--duration", str(NET_RUN_S))
    finally:
        garbage.close()
        http.shutdown()
        http.server_close()


@pytest.mark.parametrize("case", params(NET_CASES))
def test_a_wrong_network_source_keeps_retrying_with_its_reason_and_publishes_nothing(net_run, case):
    statuses = net_run.collector.statuses(case.id)
    retries = [s for s in statuses if s["state"] == "reconnecting"]
    assert retries, f"{case.id}: never reconnecting: {statuses[-3:]}"
    assert all(re.search(case.reason, s["reason"]) and "\n" not in s["reason"] for s in retries), retries[-1]
    assert retries[-1]["attempt"] >= 2 and retries[-1]["retry_in_s"] is not None
    assert not net_run.collector.detections(case.id)
    final = statuses[-1]
    assert (final["state"], final["reason"]) == ("ended", "stopped"), final


def test_the_good_clip_and_camera_beside_the_dead_urls_are_unaffected(net_run):
    assert_good_clip_untouched(net_run)
    camera = net_run.collector.detections("camera")
    assert len(camera) >= 10, f"the good camera published {len(camera)} frames in {NET_RUN_S} s"
    for previous, current in itertools.pairwise(camera):
        assert current["seq"] - previous["seq"] - 1 == current["dropped_before"]
    assert "reconnecting" not in {s["state"] for s in net_run.collector.statuses("camera")}


def test_the_timed_network_run_exits_0_without_a_traceback(net_run):
    assert net_run.result.returncode == 0, net_run.result.stderr[-3000:]
    assert "Traceback" not in net_run.result.stderr
    assert not net_run.errors()


# -- realtime pacing over broken timestamps --------------------------------------------------------------------------

def test_realtime_pacing_survives_a_10_hour_timestamp_jump(tmp_path, default_model):
    ctx = Context(tmp_path)
    run = run_group({"jumps": timestamp_jumps(ctx)}, "--realtime", "--duration", "20")
    assert run.result.returncode == 0, run.result.stderr[-2000:]
    final = run.collector.statuses("jumps")[-1]
    assert final["state"] == "ended" and final["reason"].endswith("ts_jumps.ts: end of file"), final
    dets = run.collector.detections("jumps")
    assert dets and dets[-1]["seq"] >= 10, "frames after the jump ahead and back were not published"
    paced = dets[-1]["published_at"] - dets[0]["published_at"]
    assert paced < 5, f"15 frames at 10 fps took {paced:.1f} s: the jump was slept through"


# -- fatal: configuration, model and endpoint mistakes ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fatal_ctx(tmp_path_factory, default_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield Context(tmp_path_factory.mktemp("corpus_fatal"), busy_port=busy.getsockname()[1],
                      model=Path(default_model))


@pytest.mark.parametrize("case", params(FATAL_CASES))
def test_a_fatal_mistake_exits_2_with_exactly_one_clear_line(fatal_ctx, case):
    args = case.args(fatal_ctx)
    if "--publish" not in args:
        args += ["--publish", f"tcp://127.0.0.1:{free_port()}"]
    result = detstream("run", *args, "--no-progress", timeout_s=90)
    errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert "Traceback" not in result.stderr, result.stderr[-2500:]
    assert result.returncode == 2, result.stderr[-2500:]
    assert len(errors) == 1, result.stderr[-2500:]
    assert re.search(case.error, errors[0]), errors[0]
    if case.absent:
        assert case.absent not in result.stderr + result.stdout


def test_docs_list_every_corpus_case():
    text = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    missing = [case.id for case in (*FILE_CASES, *NET_CASES, *FATAL_CASES) if f"| `{case.id}` |" not in text]
    assert not missing, f"docs/reliability.md lacks rows for {missing}"
