"""PyAVSource against the real GStreamer RTSP server on loopback (scripts/rtsp_server.py).

Every test is bounded: waits have deadlines, sources are stopped and joined,
servers are killed by the fixture.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from app.config import SourceConfig
from app.sources import create_source
from app.sources.backoff import Backoff
from app.sources.base import SourceState, SourceStatus
from app.sources.pyav import PyAVSource
from tests.integration.rtsp import DrainedBatcher, StatusLog, dead_port, make_clip, missing_seqs
from tests.integration.slow_peers import SilentServer, SlowProxy

LIVE = {"/cam": "pattern:320x240@10"}
HW = (96, 128)


class Running:
    """One source feeding a DrainedBatcher, stopped and joined on exit."""

    def __init__(self, config: SourceConfig, sink: DrainedBatcher | None = None, backoff: Backoff | None = None):
        self.config = config
        self.sink = sink or DrainedBatcher([config.id], live=True)
        self.log = StatusLog()
        self.source = PyAVSource(config, self.sink, self.log, input_hw=HW, backoff=backoff)

    def __enter__(self) -> Running:
        self.source.start()
        return self

    def __exit__(self, *exc) -> None:
        self.source.stop()
        joined = self.source.join(3)
        self.sink.close()
        assert joined, "the decoder thread did not end"

    def wait(self, state: SourceState, timeout_s: float, after: int = 0):
        status = self.log.wait_state(state, timeout_s, after)
        assert status is not None, f"no {state.value} within {timeout_s} s: {self.log.statuses[-4:]}"
        return status

    def silenced(self, silence: Callable[[], None], timeout_s: float) -> tuple[SourceStatus, float, int]:
        """Once frames flow: call ``silence`` (the camera stops sending), wait for RECONNECTING; that status,
        the seconds it took, and how many statuses came before it (for a later ``wait(..., after=)``)."""
        assert self.sink.wait_count(self.config.id, 5, timeout_s=10)
        mark = len(self.log.statuses)
        silenced_at = time.monotonic()
        silence()
        status = self.wait(SourceState.RECONNECTING, timeout_s, after=mark)
        return status, time.monotonic() - silenced_at, mark


def rtsp(url: str, stream_id: str = "cam", **kwargs) -> SourceConfig:
    return SourceConfig(id=stream_id, url=url, **kwargs)


def no_jitter(initial_s: float) -> Backoff:
    return Backoff(initial_s, 30.0, rng=lambda low, high: high)


def test_a_clean_stream_is_read_at_its_real_rate(rtsp_server):
    server = rtsp_server(LIVE)
    with Running(rtsp(server.url("/cam"))) as run:
        run.wait(SourceState.RUNNING, 10)
        assert run.sink.wait_count("cam", 45, timeout_s=10)
    received = run.sink.received["cam"]
    assert missing_seqs([r.meta.seq for r in received]) <= run.sink.dropped("cam"), "a frame was lost uncounted"
    first, last = received[15], received[44]  # after the frames buffered while probing
    rate = (last.meta.seq - first.meta.seq) / (last.meta.t_captured - first.meta.t_captured)
    assert rate == pytest.approx(10.0, rel=0.1)
    assert received[0].meta.letterbox.src_width == 320


def test_udp_transport_also_delivers_frames(rtsp_server):
    server = rtsp_server(LIVE)
    with Running(rtsp(server.url("/cam"), transport="udp")) as run:
        assert run.sink.wait_count("cam", 10, timeout_s=10)


def test_a_killed_and_restarted_server_is_reconnected_and_frames_resume(rtsp_server):
    server = rtsp_server(LIVE)
    with Running(rtsp(server.url("/cam")), backoff=no_jitter(0.2)) as run:
        assert run.sink.wait_count("cam", 10, timeout_s=10)
        mark = len(run.log.statuses)
        server.kill()
        lost = run.wait(SourceState.RECONNECTING, 5, after=mark)
        assert lost.error_kind in ("eof", "refused", "timeout") and lost.attempt == 1
        time.sleep(1.0)  # a few refused attempts while the server is down
        server.start()
        before = run.sink.count("cam")
        restarted = time.monotonic()
        run.wait(SourceState.RUNNING, 15, after=mark)
        assert run.sink.wait_count("cam", before + 10, timeout_s=10)
        reconnect_s = time.monotonic() - restarted
    states = run.log.states()[mark:]
    assert states[0] is SourceState.RECONNECTING and SourceState.CONNECTING in states
    seqs = run.sink.seqs("cam")  # increasing: seq continues across the reconnect
    assert missing_seqs(seqs) <= run.sink.dropped("cam"), "a frame was lost uncounted"
    assert reconnect_s < 10


def test_a_wrong_path_is_not_found_and_retried_with_growing_delays(rtsp_server):
    server = rtsp_server(LIVE)
    with Running(rtsp(server.url("/nope")), backoff=no_jitter(0.05)) as run:
        run.log.wait_for(lambda s: s.attempt >= 4 and s.state is SourceState.RECONNECTING, 10)
    retries = [s for s in run.log.statuses if s.state is SourceState.RECONNECTING]
    assert len(retries) >= 4
    assert {s.error_kind for s in retries} == {"not_found"}
    assert [s.attempt for s in retries[:4]] == [1, 2, 3, 4]
    assert [s.retry_in_s for s in retries[:4]] == [0.05, 0.1, 0.2, 0.4]
    assert "404" in retries[0].reason


@pytest.mark.parametrize("password", ["wrong", None])
def test_wrong_or_missing_credentials_are_classified_as_auth(rtsp_server, password):
    server = rtsp_server(LIVE, user="viewer", password="right-pass")
    url = server.url("/cam", "viewer", password) if password else server.url("/cam")
    with Running(rtsp(url)) as run:
        status = run.wait(SourceState.RECONNECTING, 10)
    assert status.error_kind == "auth" and "401" in status.reason
    assert "right-pass" not in status.reason and "wrong" not in status.reason


def test_the_right_credentials_deliver_frames(rtsp_server):
    server = rtsp_server(LIVE, user="viewer", password="p@ss:w/rd")
    with Running(rtsp(server.url("/cam", "viewer", "p@ss:w/rd"))) as run:
        assert run.sink.wait_count("cam", 5, timeout_s=10)


def test_nothing_listening_is_refused_and_retried_with_jittered_backoff():
    url = f"rtsp://127.0.0.1:{dead_port()}/cam"
    backoff = Backoff(0.05, 0.4)
    with Running(rtsp(url), backoff=backoff) as run:
        run.log.wait_for(lambda s: s.attempt >= 6 and s.state is SourceState.RECONNECTING, 10)
    retries = [s for s in run.log.statuses if s.state is SourceState.RECONNECTING]
    assert {s.error_kind for s in retries} == {"refused"}
    for failures, status in enumerate(retries):
        assert 0 <= status.retry_in_s <= backoff.cap_s(failures) + 1e-9
    assert run.log.statuses[-1].state is SourceState.ENDED


def test_a_garbage_answering_server_is_corrupt_and_retried(garbage_server):
    with Running(rtsp(garbage_server.url()), backoff=no_jitter(0.05)) as run:
        status = run.wait(SourceState.RECONNECTING, 10)
    assert status.error_kind == "corrupt"


def test_a_sigstopped_server_trips_the_stall_watchdog_and_recovers_after_sigcont(rtsp_server):
    server = rtsp_server(LIVE)
    config = rtsp(server.url("/cam"), stall_timeout_s=1.5, read_timeout_s=10)
    with Running(config, backoff=no_jitter(0.1)) as run:
        stalled, detected_s, mark = run.silenced(server.pause, 6)
        assert stalled.error_kind == "timeout"
        time.sleep(0.5)
        server.resume()
        before = run.sink.count("cam")
        run.wait(SourceState.RUNNING, 15, after=mark)
        assert run.sink.wait_count("cam", before + 5, timeout_s=10)
    assert 1.0 <= detected_s <= 3.0


def test_live_overload_drops_frames_and_never_delivers_stale_ones(rtsp_server):
    server = rtsp_server(LIVE)
    sink = DrainedBatcher(["cam"], live=True, slots=4, quota=2, max_staleness_s=0.3, consume_s=0.4, max_batch=1)
    with Running(rtsp(server.url("/cam"), max_staleness_ms=300), sink=sink) as run:
        run.wait(SourceState.RUNNING, 10)
        assert sink.wait_count("cam", 10, timeout_s=15)
    received = sink.received["cam"]
    ages = [r.t_taken - r.meta.t_captured for r in received]
    assert max(ages) <= 0.3 + 0.05, max(ages)
    dropped = sink.dropped("cam")
    assert dropped > 0
    gaps = missing_seqs([r.meta.seq for r in received])
    assert gaps <= dropped <= gaps + 4  # frames still waiting at stop are not counted yet


# -- each timeout in its own phase ---------------------------------------------------------------------------------

def test_a_silent_server_is_a_timeout_of_the_open_phase_not_corrupt_data():
    server = SilentServer()
    try:
        config = rtsp(server.url(), open_timeout_s=1.5, read_timeout_s=1.0, stall_timeout_s=1.0)
        started = time.monotonic()
        with Running(config, backoff=no_jitter(5.0)) as run:
            status = run.wait(SourceState.RECONNECTING, 6)
            took = time.monotonic() - started
    finally:
        server.close()
    assert status.error_kind == "timeout", status
    assert "no answer to OPTIONS/DESCRIBE/PLAY within 1.5 s" in status.reason, status.reason
    assert 1.3 <= took <= 3.5, f"gave up after {took:.1f} s, not at open_timeout_s"


def test_a_camera_answering_after_the_read_timeout_is_reached_within_the_open_timeout(rtsp_server):
    server = rtsp_server(LIVE)
    proxy = SlowProxy(server.port, first_reply_delay_s=2.5)
    try:
        config = rtsp(proxy.url(), open_timeout_s=8, read_timeout_s=1.0, stall_timeout_s=2.0)
        with Running(config, backoff=no_jitter(5.0)) as run:
            run.wait(SourceState.RUNNING, 12)
            assert run.sink.wait_count("cam", 5, timeout_s=10)
    finally:
        proxy.close()
    assert SourceState.RECONNECTING not in run.log.states()[:2], run.log.statuses[:3]


def test_a_camera_silent_after_play_ends_at_the_read_timeout_not_the_open_timeout(rtsp_server):
    server = rtsp_server(LIVE)
    proxy = SlowProxy(server.port)
    try:
        config = rtsp(proxy.url(), open_timeout_s=30, read_timeout_s=1.0, stall_timeout_s=5.0)
        with Running(config, backoff=no_jitter(5.0)) as run:
            status, took, _ = run.silenced(proxy.freeze, 8)
    finally:
        proxy.close()
    assert status.error_kind == "timeout" and "no data for 1 s" in status.reason, status
    assert took < 4.0, f"gave up after {took:.1f} s"


@pytest.mark.parametrize("blocked_in", ["read", "open"])
def test_stop_returns_within_a_second_while_blocked_on_a_silent_server(rtsp_server, blocked_in):
    server = rtsp_server(LIVE)
    config = rtsp(server.url("/cam"), open_timeout_s=30, read_timeout_s=30, stall_timeout_s=30)
    run = Running(config)
    if blocked_in == "open":
        server.pause()
    run.source.start()
    try:
        if blocked_in == "read":
            assert run.sink.wait_count("cam", 3, timeout_s=10)
            server.pause()
        time.sleep(1.0)
        stop_at = time.monotonic()
        run.source.stop()
        assert run.source.join(1.0), f"stop() did not end the blocked thread within 1 s: {run.log.statuses}"
        assert time.monotonic() - stop_at < 1.0
    finally:
        server.resume()
        run.source.stop()
        run.source.join(3)
        run.sink.close()
    terminal = run.log.statuses[-1]
    assert terminal.state is SourceState.ENDED and terminal.reason == "stopped"
    assert run.sink.close_calls["cam"] == 1


class ExplodingSink(DrainedBatcher):
    """A sink that fails with the URL in its message, like a careless library would."""

    def __init__(self, url: str) -> None:
        super().__init__(["boom"], live=True)
        self.url = url

    def acquire(self, stream_id, stop):
        raise RuntimeError(f"cannot take a slot for {self.url}")


def test_a_password_in_the_url_appears_in_no_log_status_or_exception(rtsp_server, caplog):
    secret = "Sup3rS3cret"
    server = rtsp_server(LIVE, user="viewer", password=secret)
    good, bad = server.url("/cam", "viewer", secret), server.url("/cam", "viewer", secret + "x")
    caplog.set_level(logging.DEBUG)
    with Running(rtsp(good, "good"), backoff=no_jitter(0.1)) as run_good, \
            Running(rtsp(bad, "bad"), backoff=no_jitter(0.1)) as run_bad:
        assert run_good.sink.wait_count("good", 3, timeout_s=10)
        run_bad.wait(SourceState.RECONNECTING, 10)
        mark = len(run_good.log.statuses)
        server.kill()
        run_good.wait(SourceState.RECONNECTING, 5, after=mark)
        names = [t.name for t in threading.enumerate()]
    server.start()
    exploding = ExplodingSink(good)
    boom_log = StatusLog()
    boom = create_source(rtsp(good, "boom"), exploding, boom_log, input_hw=HW)
    boom.start()
    assert boom.join(10)
    exploding.close()
    texts = [r.getMessage() for r in caplog.records] + [r.exc_text or "" for r in caplog.records]
    texts += [logging.Formatter().format(r) for r in caplog.records]
    statuses = run_good.log.statuses + run_bad.log.statuses + boom_log.statuses
    texts += [s.reason for s in statuses] + names
    assert any("viewer:***@" in t for t in texts)
    assert any("internal error" in t for t in texts), "the exploding sink must have been reported"
    leaks = [t for t in texts if secret in t]
    assert not leaks, leaks[:3]


def test_a_file_mount_is_served_without_reencoding_and_loops(rtsp_server, tmp_path):
    clip = make_clip(tmp_path / "short.mp4", frames=15, fps=10, size="352x288")
    server = rtsp_server({"/clip": str(clip)}, loop=True)
    with Running(rtsp(server.url("/clip"))) as run:
        assert run.sink.wait_count("cam", 25, timeout_s=15), "a 15-frame clip must loop to give 25 frames"
    received = run.sink.received["cam"]
    assert missing_seqs([r.meta.seq for r in received]) <= run.sink.dropped("cam"), "a frame was lost uncounted"
    assert {(r.meta.letterbox.src_width, r.meta.letterbox.src_height) for r in received} == {(352, 288)}
    assert not any(s.state is SourceState.RECONNECTING for s in run.log.statuses), "looping is seamless"


def test_eight_cameras_and_a_dead_one_share_a_batcher_and_survive_a_server_restart(rtsp_server):
    cams = [f"cam{i}" for i in range(8)]
    server = rtsp_server({f"/{cam}": "pattern:320x240@5" for cam in cams})
    sink = DrainedBatcher([*cams, "dead"], live=True, slots=27, quota=3, max_batch=8)
    logs = {stream_id: StatusLog() for stream_id in [*cams, "dead"]}
    configs = [rtsp(server.url(f"/{cam}"), cam) for cam in cams]
    configs.append(rtsp(f"rtsp://127.0.0.1:{dead_port()}/gone", "dead"))
    sources = [PyAVSource(c, sink, logs[c.id], input_hw=HW, backoff=no_jitter(0.2)) for c in configs]
    for source in sources:
        source.start()
    try:
        for cam in cams:
            assert sink.wait_count(cam, 5, timeout_s=15), cam
        assert logs["dead"].wait_state(SourceState.RECONNECTING, 5) is not None
        marks = {cam: len(logs[cam].statuses) for cam in cams}
        server.kill()
        for cam in cams:
            assert logs[cam].wait_state(SourceState.RECONNECTING, 10, after=marks[cam]) is not None, cam
        before = {cam: sink.count(cam) for cam in cams}
        server.start()
        for cam in cams:
            assert sink.wait_count(cam, before[cam] + 3, timeout_s=20), cam
    finally:
        for source in sources:
            source.stop()
        joined = [source.join(3) for source in sources]
        sink.close()
    assert all(joined)
    for cam in cams:
        assert missing_seqs(sink.seqs(cam)) <= sink.dropped(cam), f"{cam}: a frame was lost uncounted"
    assert sink.count("dead") == 0
    assert {s.error_kind for s in logs["dead"].statuses if s.state is SourceState.RECONNECTING} == {"refused"}
