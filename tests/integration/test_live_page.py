"""The live page in a real browser: Debian's chromium driven by Playwright (no browser download).

A `detstream run` with two looping file sources and one RTSP camera from the
GStreamer test server: the page shows three tiles whose pictures change, the
camera killed on the server turns `reconnecting` and back to `running`, and a
source added through the API appears as a fourth tile. Screenshots are kept
under out/test-artifacts/live_page/.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from tests.conftest import ROOT, free_port, wait_until
from tests.integration.rtsp import RtspServer, gst_rtsp_missing, make_clip

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "out" / "test-artifacts" / "live_page"
STARTUP_TIMEOUT_S = 60.0
STEP_TIMEOUT_MS = 30_000

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extras)")
pytestmark = [pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} missing (apt: chromium)"),
              pytest.mark.skipif(bool(gst_rtsp_missing()), reason=str(gst_rtsp_missing()))]


def _post(url: str, body: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def _sources(base: str) -> list[dict]:
    try:
        with urllib.request.urlopen(base + "/api/sources", timeout=3) as reply:
            return json.load(reply)["sources"]
    except OSError:
        return []


def test_the_page_shows_every_source_live_follows_a_reconnect_and_an_added_source(tmp_path, default_model):
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    clips = tmp_path / "clips"
    clips.mkdir()
    clip = make_clip(clips / "clip.mp4", frames=50, fps=10, size="320x240")
    camera = RtspServer({"/cam": "pattern:320x240@5"}).start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = tmp_path / "run.yaml"
    files = [{"id": name, "url": str(clip), "loop": True, "realtime": True, "max_fps": 5} for name in ("one", "two")]
    config.write_text(yaml.safe_dump({
        "sources": [*files, {"id": "cam", "url": camera.url("/cam"), "open_timeout_s": 2, "read_timeout_s": 2,
                             "stall_timeout_s": 2, "reconnect": {"initial_s": 0.3, "max_s": 1.0}}],
        "engine": {"max_sources": 4, "max_batch": 4},
        "publish": {"endpoint": f"tcp://127.0.0.1:{free_port()}", "startup_wait_s": 0},
        "http": {"enabled": True, "port": port, "view_fps": 5, "allowed_paths": [str(clips)]}}))
    log = tmp_path / "stderr.log"
    proc = subprocess.Popen([sys.executable, "-m", "app", "run", str(config), "--no-progress",
                             "--models-dir", str(default_model.parent)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), start_new_session=True)
    try:
        assert wait_until(lambda: [s["state"] for s in _sources(base)] == ["running"] * 3, STARTUP_TIMEOUT_S), \
            log.read_text()[-2000:]
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(STEP_TIMEOUT_MS)
                page.goto(base + "/")
                page.wait_for_function("document.querySelectorAll('.tile').length === 3")
                page.wait_for_function("[...document.querySelectorAll('.tile img')].every(i => i.naturalWidth > 0)")
                page.screenshot(path=str(ARTIFACTS / "1-three-tiles.png"))
                tiles = {t.get_attribute("data-source"): t for t in page.locator(".tile").all()}
                assert set(tiles) == {"one", "two", "cam"}
                first = {sid: tile.locator("img").screenshot() for sid, tile in tiles.items()}
                page.wait_for_timeout(1500)
                second = {sid: tile.locator("img").screenshot(path=str(ARTIFACTS / f"2-{sid}.png"))
                          for sid, tile in tiles.items()}
                assert all(first[sid] != second[sid] for sid in tiles), "every tile's picture changes"

                camera.kill()
                page.wait_for_selector(".tile[data-source=cam][data-state=reconnecting]")
                page.screenshot(path=str(ARTIFACTS / "3-camera-reconnecting.png"))
                camera.start()
                page.wait_for_selector(".tile[data-source=cam][data-state=running]")
                page.screenshot(path=str(ARTIFACTS / "4-camera-back.png"))

                assert _post(base + "/api/sources", {"id": "three", "url": str(clip), "loop": True,
                                                     "realtime": True, "max_fps": 5}) == 201
                page.wait_for_selector(".tile[data-source=three]")
                page.wait_for_function("document.querySelectorAll('.tile').length === 4")
                page.wait_for_function("document.querySelector('.tile[data-source=three] img').naturalWidth > 0")
                page.screenshot(path=str(ARTIFACTS / "5-four-tiles.png"))
                page.locator(".tile[data-source=cam]").click()
                page.wait_for_function("document.querySelectorAll('.tile:not([hidden])').length === 1")
                page.screenshot(path=str(ARTIFACTS / "6-one-camera-large.png"))
            finally:
                browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        camera.stop()
    assert proc.returncode == 0, log.read_text()[-3000:]
