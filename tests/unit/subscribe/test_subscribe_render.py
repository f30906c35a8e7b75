"""run_subscribe, the function behind `detstream subscribe`: formats, --out, --count/--timeout exit codes."""

from __future__ import annotations

import io
import json
import threading

import pytest
from subscribe_payloads import detection, status

from app.analytics.engine import Event
from app.publish.messages import event_payload
from app.subscribe.messages import DetectionMessage, StatusMessage
from app.subscribe.render import run_subscribe, table_row


def run_in_thread(endpoint, fmt, count, timeout_s, out_path=None, streams=()):
    output = io.StringIO()
    result = {}

    def target():
        result["code"] = run_subscribe(endpoint, list(streams), fmt, count, timeout_s, out_path, output=output)

    thread = threading.Thread(target=target, name="test.subscribe")
    thread.start()
    return thread, output, result


def publish_when_subscribed(publisher, messages, subscriptions=2):
    assert publisher.wait_for_subscribers(subscriptions, 5.0)
    for kind, payload in messages:
        if kind == "det":
            publisher.publish_detections(payload["stream"], payload)
        else:
            publisher.publish_status(payload["stream"], payload)


def test_jsonl_prints_one_line_per_message_and_out_records_the_same(publisher, endpoint, tmp_path):
    out_file = tmp_path / "record.jsonl"
    thread, output, result = run_in_thread(endpoint, "jsonl", 2, 10.0, out_file)
    sent = [("status", status("gate")), ("det", detection("gate", 0)), ("det", detection("gate", 1))]
    publish_when_subscribed(publisher, sent)
    thread.join(10)
    assert result["code"] == 0
    printed = [json.loads(line) for line in output.getvalue().splitlines()]
    assert printed == [payload for _, payload in sent]
    recorded = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert recorded == printed


def test_json_prints_one_indented_block_per_message(publisher, endpoint):
    thread, output, result = run_in_thread(endpoint, "json", 1, 10.0)
    publish_when_subscribed(publisher, [("det", detection("gate", 0))])
    thread.join(10)
    blocks = [b for b in output.getvalue().split("\n\n") if b.strip()]
    assert result["code"] == 0 and len(blocks) == 1
    assert json.loads(blocks[0])["seq"] == 0 and '\n  "schema"' in blocks[0]


def test_table_shows_stream_seq_latency_label_counts_drops_and_gaps(publisher, endpoint, tmp_path):
    thread, output, result = run_in_thread(endpoint, "table", 2, 10.0, streams=["gate"])
    publish_when_subscribed(publisher, [("det", detection("gate", 0)), ("det", detection("gate", 3, 1))])
    thread.join(10)
    text = output.getvalue()
    assert result["code"] == 0
    assert "person×2 car×1" in text and "48.0" in text
    assert "gap: 2 missing before seq 3 (publisher reported 1)" in text


def test_table_rows_for_detections_and_statuses():
    row = table_row(DetectionMessage.from_payload(detection("gate", 7, 2, labels=())))
    assert row.split()[:4] == ["gate", "7", "48.0", "2"] and row.endswith("-")
    reconnecting = status("gate", "reconnecting") | {"reason": "timeout", "attempt": 3, "retry_in_s": 4.0}
    line = table_row(StatusMessage.from_payload(reconnecting))
    assert "reconnecting (timeout) attempt 3, retry in 4.0 s" in line


def test_timing_out_before_count_messages_exits_1_and_timeout_alone_exits_0(endpoint):
    assert run_subscribe(endpoint, [], "jsonl", 5, 0.3, None, output=io.StringIO()) == 1
    assert run_subscribe(endpoint, [], "jsonl", None, 0.3, None, output=io.StringIO()) == 0


def test_an_unwritable_out_file_or_bad_endpoint_exits_2(endpoint, tmp_path):
    assert run_subscribe(endpoint, [], "jsonl", 1, 0.1, tmp_path / "missing" / "x.jsonl", output=io.StringIO()) == 2
    assert run_subscribe("tcp://nonsense", [], "jsonl", 1, 0.1, None, output=io.StringIO()) == 2



@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_events_prints_zone_and_line_events_as_a_table_and_as_jsonl(publisher, endpoint, fmt):
    counts = {"in": 6, "out": 3, "labels": {"person": {"in": 6, "out": 3}}}
    cross = event_payload("gate", Event("cross", "line", "door", 12, "person", 0.9, (1.0, 2.0, 3.0, 4.0), "in", None,
                                       counts), seq=40, pts=1.6, at=1.0)
    zone_counts = {"in": 2, "out": 2, "occupancy": 0, "labels": {"person": {"in": 2, "out": 2, "occupancy": 0}}}
    lost = event_payload("gate", Event("exit", "zone", "yard", 5, "person", None, None, None, "lost", zone_counts),
                         seq=41, pts=None, at=2.0)
    output = io.StringIO()
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=run_subscribe(
        endpoint, [], fmt, 2, 10.0, None, output=output, events=True)), name="test.subscribe")
    thread.start()
    assert publisher.wait_for_subscribers(1, 5.0)
    publisher.publish_detections("gate", detection("gate", 0))  # not subscribed with --events
    publisher.publish_event("gate", cross)
    publisher.publish_event("gate", lost)
    thread.join(10)
    assert result["code"] == 0
    text = output.getvalue()
    if fmt == "table":
        rows = text.splitlines()
        assert rows[0].split()[:4] == ["stream", "seq", "event", "zone/line"]
        assert rows[1].split() == ["gate", "40", "cross", "in", "door", "12", "person", "in", "6", "out", "3"]
        assert rows[2].split() == ["gate", "41", "exit", "(lost)", "yard", "5", "person", "in", "2", "out", "2",
                                   "now", "0"]
    else:
        assert [json.loads(line) for line in text.splitlines()] == [cross, lost]
