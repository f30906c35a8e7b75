"""The progress line reads the pipeline's stream snapshots afresh on every update."""

from __future__ import annotations

import logging

from app.drops import DropReason
from app.sources.base import SourceState
from app.stages.progress import ProgressReporter
from app.stages.results import StreamSnapshot


def snapshot(state: SourceState, published: int, live_drops: int, p50_ms: float) -> StreamSnapshot:
    return StreamSnapshot(state, "", 0, None, published + live_drops, published,
                          {DropReason.LIVE_POLICY: live_drops} if live_drops else {}, p50_ms)


def test_each_update_shows_the_latest_snapshot_of_every_stream(caplog):
    current = {"cam": snapshot(SourceState.CONNECTING, 0, 0, 0.0)}
    caplog.set_level(logging.INFO, logger="app.stages.progress")
    with ProgressReporter(lambda: dict(current), lambda sid: None, interactive=False, log_every_s=3600) as progress:
        current["cam"] = snapshot(SourceState.RUNNING, 42, 3, 12.5)
        progress.update()
    last = [r.getMessage() for r in caplog.records][-1]
    assert last.startswith("cam: 42/? frames  running")
    assert "drops 3" in last and "p50   12.5 ms" in last
