"""The REST API and the pictures against a running pipeline (in-process, fake engine, FastAPI's TestClient)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

from app.config import parse_config
from app.http.api import create_app
from app.http.settings import HttpConfig
from app.http.view import ViewSink
from app.pipeline import Pipeline
from tests.fakes import FixedEngine, MemoryPublisher

SECRET = "Pw4api-secret"


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=25",
                    "-frames:v", "40", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(folder / "small.mp4")],
                   check=True, timeout=60)
    return folder


class Run:
    """A pipeline with one steady looping source, its view sink and an API client."""

    def __init__(self, clips: Path, *, max_sources: int = 4, token: str | None = None, **http) -> None:
        self.clip = clips / "small.mp4"
        self.settings = HttpConfig(enabled=True, allowed_paths=[str(clips)], **http)
        config = parse_config({"sources": [{"id": "steady", "url": str(self.clip), "loop": True, "realtime": True,
                                            "mode": "file"}],
                               "engine": {"max_batch": 4, "max_wait_ms": 2, "max_sources": max_sources},
                               "publish": {"startup_wait_s": 0}, "http": self.settings.model_dump()})
        self.publisher = MemoryPublisher()
        self.view = ViewSink(lambda: self.pipeline.spec.class_names, view_fps=10)
        self.pipeline = Pipeline(config, engine=FixedEngine(), publisher=self.publisher, sinks=[self.view])
        self.client = TestClient(create_app(self.pipeline, self.view, self.settings, token=token),
                                 base_url="http://127.0.0.1:8080")

    def __enter__(self) -> Run:
        self.pipeline.start()
        return self

    def __exit__(self, *exc) -> None:
        self.pipeline.stop()
        assert self.pipeline.wait(30)
        self.pipeline.close()

    def source(self, stream_id: str, **fields) -> dict:
        return {"id": stream_id, "url": str(self.clip), "loop": True, "realtime": True, **fields}


def _wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_sources_are_listed_added_changed_and_removed_with_json_errors_naming_the_field(clips):
    with Run(clips, max_sources=2) as run:
        c = run.client
        listed = c.get("/api/sources").json()
        assert [s["id"] for s in listed["sources"]] == ["steady"] and listed["capacity"] == 2
        added = c.post("/api/sources", json=run.source("cam2"))
        assert added.status_code == 201 and added.json()["id"] == "cam2"
        assert _wait_until(lambda: c.get("/api/sources/cam2").json()["published"] > 3)
        duplicate = c.post("/api/sources", json=run.source("cam2"))
        assert duplicate.status_code == 409 and "exists" in duplicate.json()["error"]
        full = c.post("/api/sources", json=run.source("cam3"))
        assert full.status_code == 409 and "engine.max_sources" in full.json()["error"]
        bad = c.post("/api/sources", json=run.source("cam3", max_fps=-2))
        assert bad.status_code == 422 and bad.json()["field"] == "max_fps"
        unknown_field = c.post("/api/sources", json=run.source("cam3", colour="red"))
        assert unknown_field.status_code == 422 and unknown_field.json()["field"] == "colour"
        assert c.post("/api/sources", content=b"{not json").status_code == 422
        assert c.post("/api/sources", json=[1, 2]).status_code == 422
        patched = c.patch("/api/sources/cam2", json={"max_fps": 4, "max_staleness_ms": 900})
        assert patched.status_code == 200 and patched.json()["max_fps"] == 4 and not patched.json()["restarted"]
        assert c.patch("/api/sources/cam2", json={"max_fps": "fast"}).json()["field"] == "max_fps"
        assert c.patch("/api/sources/nope", json={"max_fps": 4}).status_code == 404
        assert c.get("/api/sources/nope").status_code == 404
        removed = c.delete("/api/sources/cam2")
        assert removed.status_code == 200 and removed.json()["reason"] == "removed"
        assert c.delete("/api/sources/cam2").status_code == 404
        assert [s["id"] for s in c.get("/api/sources").json()["sources"]] == ["steady"]
        assert run.publisher.of("cam2", "statuses")[-1]["reason"] == "removed"
        assert c.post("/api/reload").status_code == 409  # not started from a config file


def test_a_line_patched_onto_a_running_source_counts_without_a_reconnect_and_a_source_is_added_with_a_zone(clips):
    with Run(clips) as run:
        c = run.client
        assert _wait_until(lambda: run.pipeline.streams()["steady"].published > 5)
        statuses_before = len(run.publisher.of("steady", "statuses"))
        line = {"name": "door", "points": [[0.5, 0], [0.5, 1]], "units": "normalized"}
        patched = c.patch("/api/sources/steady", json={"lines": [line]})
        assert patched.status_code == 200 and not patched.json()["restarted"]
        assert _wait_until(lambda: any("analytics" in d for d in run.publisher.of("steady")))
        first = next(d for d in run.publisher.of("steady") if "analytics" in d)
        assert first["seq"] > 5 and first["analytics"]["lines"] == {"door": {"in": 0, "out": 0}}
        assert {s["state"] for s in run.publisher.of("steady", "statuses")[statuses_before:]} <= {"running"}

        zone = {"name": "all", "points": [[0, 0], [1, 0], [1, 1], [0, 1]], "units": "normalized"}
        unknown = c.post("/api/sources", json=run.source("zoned", zones=[{**zone, "classes": ["persn"]}]))
        assert unknown.status_code == 422 and unknown.json()["field"] == "zones[0].classes"
        assert "did you mean 'person'" in unknown.json()["error"]
        assert c.post("/api/sources", json=run.source("zoned", zones=[zone])).status_code == 201
        assert _wait_until(lambda: any(e["kind"] == "enter" for e in run.publisher.of("zoned", "events")))
    steady = [d["seq"] for d in run.publisher.of("steady")]
    assert steady == list(range(len(steady))), "the patch did not restart the source"


@pytest.mark.parametrize("url, words", [("ftp://cam/x", "scheme"), ("/etc/passwd", "allowed_paths"),
                                        ("file:///etc/passwd", "allowed_paths"), ("rtsp://cam/x;reboot", "shell"),
                                        ("rtsp://cam/$(id)", "shell"), ("", "url")])
def test_a_refused_url_is_422_naming_the_url_field(clips, url, words):
    with Run(clips) as run:
        answer = run.client.post("/api/sources", json={"id": "x", "url": url})
        assert answer.status_code == 422 and answer.json()["field"] == "url" and words in answer.json()["error"]


def test_oversized_bodies_are_refused_before_they_are_read_whole(clips):
    with Run(clips, max_body_bytes=1024) as run:
        big = {"id": "big", "url": "rtsp://cam/" + "a" * 4000}
        assert run.client.post("/api/sources", json=big).status_code == 413

        def chunks():
            for _ in range(64):
                yield b" " * 512

        assert run.client.post("/api/sources", content=chunks()).status_code == 413  # no Content-Length


def test_credentials_never_appear_in_any_response(clips):
    with Run(clips) as run:
        c = run.client
        url = f"rtsp://admin:{SECRET}@127.0.0.1:9/cam"
        bodies = [c.post("/api/sources", json={"id": "locked", "url": url, "open_timeout_s": 0.5}).text]
        assert _wait_until(lambda: c.get("/api/sources/locked").json()["state"] in ("reconnecting", "failed"))
        bodies += [c.get(path).text for path in ("/", "/static/app.js", "/static/style.css", "/api/sources",
                                                 "/api/sources/locked")]
        bodies.append(c.post("/api/sources", json={"id": "locked", "url": url}).text)  # 409 names the id only
        bodies.append(c.post("/api/sources", json={"id": "x", "url": url, "max_fps": 0}).text)  # 422
        bodies.append(c.patch("/api/sources/locked", json={"max_fps": 2}).text)
        bodies.append(c.delete("/api/sources/locked").text)
        assert all(SECRET not in body for body in bodies), [b for b in bodies if SECRET in b]
        assert "***" in bodies[5]
        statuses = [s["reason"] for s in run.publisher.of("locked", "statuses")]
        assert statuses and all(SECRET not in reason for reason in statuses)


def test_control_routes_need_the_token_and_view_routes_too_unless_public(clips):
    with Run(clips, token="t0k3n-xyz", host="0.0.0.0", public_view=True) as run:
        c = run.client
        assert c.post("/api/sources", json=run.source("a")).status_code == 401
        wrong = {"Authorization": "Bearer wrong"}
        assert c.post("/api/sources", json=run.source("a"), headers=wrong).status_code == 401
        assert c.delete("/api/sources/steady").status_code == 401
        assert c.patch("/api/sources/steady", json={"max_fps": 1}).status_code == 401
        assert c.post("/api/reload").status_code == 401
        assert c.get("/api/sources").status_code == 200 and c.get("/").status_code == 200  # public_view
        ok = c.post("/api/sources", json=run.source("a"), headers={"Authorization": "Bearer t0k3n-xyz"})
        assert ok.status_code == 201
        run.client = TestClient(create_app(run.pipeline, run.view, run.settings.model_copy(
            update={"public_view": False}), token="t0k3n-xyz"), base_url="http://127.0.0.1:8080")
        assert run.client.get("/api/sources").status_code == 401 and run.client.get("/").status_code == 401
        assert run.client.get("/api/sources", headers={"Authorization": "Bearer t0k3n-xyz"}).status_code == 200


def test_pictures_are_drawn_only_for_watched_sources_and_change(clips):
    with Run(clips) as run:
        c = run.client
        assert _wait_until(lambda: run.pipeline.streams()["steady"].published > 20)
        assert run.view.picture("steady") is None, "nobody watched: nothing drawn"
        first = c.get("/api/sources/steady/snapshot.jpg")
        assert first.status_code in (200, 204)
        assert _wait_until(lambda: c.get("/api/sources/steady/snapshot.jpg").status_code == 200)
        one = c.get("/api/sources/steady/snapshot.jpg")
        assert one.headers["content-type"] == "image/jpeg" and one.content[:2] == b"\xff\xd8"
        assert _wait_until(lambda: c.get("/api/sources/steady/snapshot.jpg").headers.get("x-picture")
                           != one.headers["x-picture"])
        listed = c.get("/api/sources/steady").json()
        assert listed["fps"] > 0 and listed["p99_ms"] >= listed["p50_ms"] > 0


def test_other_web_origins_and_rebound_host_names_are_refused(clips):
    with Run(clips) as run:
        c = run.client
        evil = {"Origin": "http://evil.example"}
        assert c.post("/api/sources", json=run.source("a"), headers=evil).status_code == 403
        assert c.delete("/api/sources/steady", headers=evil).status_code == 403
        assert c.get("/api/sources", headers={"Host": "evil.example:8080"}).status_code == 403
        form = c.post("/api/sources", content=b'{"id": "a", "url": "rtsp://cam/x"}',
                      headers={"Content-Type": "text/plain"})
        assert form.status_code == 415
        same = {"Origin": "http://127.0.0.1:8080"}
        assert c.post("/api/sources", json=run.source("a"), headers=same).status_code == 201
        assert c.get("/api/sources", headers={"Host": "localhost:8080"}).status_code == 200


def _resources() -> tuple[int, int, int]:
    """(threads, open files, RSS) of this process; threads leave out the HTTP test client's idle worker pool."""
    process = psutil.Process()
    threads = [t for t in threading.enumerate() if not t.name.startswith("AnyIO worker")]
    return len(threads), process.num_fds(), process.memory_info().rss


ROUNDS = int(os.environ.get("DETSTREAM_CHURN_ROUNDS", "20"))
"""Add-5/remove-5 rounds (about 4 s for 20 with the fake engine)."""
ONE_BATCH_MS = 50.0
"""A generous bound on one batch's time here (2 ms window, fake engine, a shared 2-core machine)."""


def _churn(c: TestClient, run: Run) -> None:
    """Add five sources, wait until each has published, remove them."""
    for i in range(5):
        assert c.post("/api/sources", json=run.source(f"churn{i}")).status_code == 201
    assert _wait_until(lambda: all(c.get(f"/api/sources/churn{i}").json()["published"] > 0 for i in range(5)), 20)
    for i in range(5):
        assert c.delete(f"/api/sources/churn{i}").status_code == 200


def test_adding_and_removing_five_sources_repeatedly_leaves_the_steady_source_and_the_process_as_they_were(clips):
    with Run(clips, max_sources=6) as run:
        c = run.client
        assert _wait_until(lambda: run.pipeline.streams()["steady"].published > 10)
        _churn(c, run)  # one round first: decoder and allocator first-use memory is not a leak
        baseline_p99 = run.view.rates("steady").p99_ms
        before = _resources()
        worst_p99 = 0.0
        for _ in range(ROUNDS):
            _churn(c, run)
            worst_p99 = max(worst_p99, run.view.rates("steady").p99_ms)
        after = _resources()
        assert worst_p99 <= baseline_p99 + ONE_BATCH_MS, f"steady p99 {baseline_p99} -> {worst_p99} ms"
        assert after[0] <= before[0] * 1.05, f"threads {before[0]} -> {after[0]}"
        assert after[1] <= before[1] * 1.05, f"open files {before[1]} -> {after[1]}"
        assert after[2] <= before[2] * 1.05, f"RSS {before[2] >> 20} -> {after[2] >> 20} MiB"
        assert [s["id"] for s in c.get("/api/sources").json()["sources"]] == ["steady"]
    steady = [d["seq"] for d in run.publisher.of("steady")]
    assert steady == list(range(len(steady))), "the steady (paced, lossless) source's seq has no gap"
