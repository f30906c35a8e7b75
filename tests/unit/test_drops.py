"""DropLedger: the one count of published and dropped frames per stream, by reason, mirrored to Prometheus."""

from __future__ import annotations

import threading

from app.drops import DropLedger, DropReason
from app.metrics import PipelineMetrics


def test_counts_are_per_stream_and_per_reason():
    ledger = DropLedger()
    ledger.add_stream("a")
    ledger.drop("a", DropReason.LIVE_POLICY, 3)
    ledger.drop("a", DropReason.ENGINE_ERROR)
    ledger.publish("a")
    counts = ledger.counts("a")
    assert counts.published == 1 and counts.dropped == 4 == ledger.dropped("a")
    assert dict(counts.dropped_by_reason) == {DropReason.LIVE_POLICY: 3, DropReason.ENGINE_ERROR: 1}
    assert ledger.counts("b").dropped == 0 and ledger.dropped("b") == 0


def test_publish_returns_the_live_policy_drops_since_the_previous_publish_only():
    ledger = DropLedger()
    ledger.drop("a", DropReason.LIVE_POLICY, 2)
    ledger.drop("a", DropReason.ENGINE_ERROR, 5)  # not the live policy: not an overload
    assert ledger.publish("a") == 2
    assert ledger.publish("a") == 0
    assert ledger.dropped("a") == 7  # reading the per-publish count leaves the totals alone


def test_prometheus_counters_are_fed_in_the_same_call():
    metrics = PipelineMetrics()
    ledger = DropLedger(metrics)
    ledger.drop("a", DropReason.LIVE_POLICY, 2)
    ledger.publish("a")
    sample = metrics.registry.get_sample_value
    assert sample("detstream_frames_dropped_total", {"stream": "a", "reason": "live_policy"}) == 2
    assert sample("detstream_frames_published_total", {"stream": "a"}) == 1


def test_drops_from_many_threads_are_all_counted():
    ledger = DropLedger()
    threads = [threading.Thread(target=lambda: [ledger.drop("a", DropReason.LIVE_POLICY) for _ in range(2000)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.dropped("a") == 8000


def test_hwm_warning_is_due_at_the_first_drop_then_at_most_once_a_minute():
    from app.drops import HwmWarning

    warning = HwmWarning(every_s=60.0)
    assert warning.due(0, now=0.0) is None  # nothing missed, nothing to say
    first = warning.due(5, now=1.0)
    assert first is not None and "missed 5 messages" in first and "(5 in all)" in first
    assert warning.due(500, now=30.0) is None  # within the minute: quiet
    later = warning.due(800, now=61.5)
    assert later is not None and "missed 795 messages in the last 60 s (800 in all)" in later
    assert warning.due(800, now=200.0) is None  # the drops stopped: so does the warning
