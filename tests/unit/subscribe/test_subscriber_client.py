"""The typed Subscriber against a real ZmqPublisher on loopback."""

from __future__ import annotations

import json
import threading
import time

import pytest
import zmq
from subscribe_payloads import detection, status

from app.config import PublishConfig
from app.publish.zmq import ZmqPublisher
from app.subscribe import DetectionMessage, GapEvent, StatusMessage, Subscriber


def collect(sub: Subscriber, count: int, timeout_s: float = 5.0) -> list:
    return list(sub.iter_messages(count=count, timeout_s=timeout_s))


def test_iterating_yields_typed_detection_and_status_messages(publisher, endpoint):
    with Subscriber(endpoint) as sub:
        assert publisher.wait_for_subscribers(2, 5.0)
        publisher.publish_status("gate", status("gate"))
        publisher.publish_detections("gate", detection("gate", 0))
        first, second = collect(sub, 2)
    assert isinstance(first, StatusMessage) and first.state == "running" and first.retry_in_s is None
    assert isinstance(second, DetectionMessage)
    assert second.seq == 0 and second.latency_ms.total == 48.0 and second.width == 640
    assert second.detections[0].box == (10.0, 20.0, 50.0, 90.0) and second.detections[0].track_id is None
    assert second.label_counts() == {"person": 2, "car": 1}
    assert second.to_payload() == detection("gate", 0)


def test_stream_filter_is_exact_cam1_does_not_receive_cam10(publisher, endpoint):
    with Subscriber(endpoint, streams=["cam1"]) as sub:
        assert sub.subscriptions == ["det/cam1/", "status/cam1/"]
        assert publisher.wait_for_subscribers(2, 5.0)
        publisher.publish_detections("cam10", detection("cam10", 0))
        publisher.publish_detections("cam1", detection("cam1", 5))
        messages = collect(sub, 2, timeout_s=0.5)
    assert [(m.stream, m.seq) for m in messages] == [("cam1", 5)]


def test_an_injected_seq_gap_is_reported_and_checked_against_dropped_before(publisher, endpoint):
    with Subscriber(endpoint, topics=("det/",)) as sub:
        assert publisher.wait_for_subscribers(1, 5.0)
        for seq, dropped_before in [(0, 0), (1, 0), (3, 0), (6, 2), (7, 0)]:
            publisher.publish_detections("cam", detection("cam", seq, dropped_before))
        assert [m.seq for m in collect(sub, 5)] == [0, 1, 3, 6, 7]
        assert list(sub.gaps) == [GapEvent("cam", 2, 3, 0), GapEvent("cam", 4, 6, 2)]
        assert [g.explained for g in sub.gaps] == [False, True]
        assert (sub.stats.gaps, sub.stats.missing, sub.stats.unexplained_gaps) == (2, 3, 1)


def test_seqs_starting_again_from_zero_are_a_restart_not_a_gap(publisher, endpoint):
    with Subscriber(endpoint, topics=("det/",)) as sub:
        assert publisher.wait_for_subscribers(1, 5.0)
        for seq in (10, 11, 0, 1):
            publisher.publish_detections("cam", detection("cam", seq))
        collect(sub, 4)
    assert sub.stats.restarts == 1 and sub.stats.gaps == 0


def test_malformed_and_invalid_payloads_are_skipped_and_counted(endpoint):
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.linger = 0
    pub.bind(endpoint)
    try:
        with Subscriber(endpoint) as sub:
            time.sleep(0.3)  # plain PUB: no way to see the subscription arrive
            pub.send_multipart([b"det/cam/", b"\xc1not msgpack"])
            pub.send_multipart([b"det/cam/", b'{"schema": "detstream.detections/1"}'])
            pub.send_multipart([b"det/cam/"])
            pub.send_multipart([b"det/cam/", b'{"schema": "detstream.detections/1"}'[:-1] + b', "x": 1}'])
            pub.send_multipart([b"status/cam/", json.dumps(status("cam")).encode()])
            messages = collect(sub, 1)
        assert [type(m) for m in messages] == [StatusMessage]
        assert sub.stats.invalid == 4 and sub.stats.received == 5
    finally:
        pub.close()
        context.term()


def test_iteration_stops_at_the_timeout_when_nothing_arrives(endpoint):
    with Subscriber(endpoint) as sub:
        started = time.monotonic()
        assert collect(sub, 10, timeout_s=0.3) == []
        assert 0.25 < time.monotonic() - started < 2.0


def test_an_iterating_subscriber_reconnects_to_a_restarted_publisher(endpoint):
    received: list = []
    with Subscriber(endpoint, topics=("det/",)) as sub:
        # libzmq re-sends subscriptions after a reconnect only while the SUB socket is in use, so iterate meanwhile
        reader = threading.Thread(target=lambda: received.extend(sub.iter_messages(count=2, timeout_s=15)),
                                  name="test.reader")
        reader.start()
        for restart in range(2):  # the same endpoint twice: the second publisher is a restart
            with ZmqPublisher(PublishConfig(endpoint=endpoint, linger_ms=500)) as pub:
                assert pub.wait_for_subscribers(1, 5.0)
                pub.publish_detections("cam", detection("cam", 0))
                deadline = time.monotonic() + 5
                while len(received) <= restart and time.monotonic() < deadline:
                    time.sleep(0.02)
        reader.join(10)
    assert [m.seq for m in received] == [0, 0]
    assert sub.stats.restarts == 1


def test_an_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="encoding"):
        Subscriber(encoding="pickle")  # type: ignore[arg-type]


def test_a_subscriber_reaches_a_publisher_on_ipv6_loopback():
    import socket

    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        endpoint = f"tcp://[::1]:{probe.getsockname()[1]}"
    with ZmqPublisher(PublishConfig(endpoint=endpoint, linger_ms=0)) as pub, Subscriber(endpoint) as sub:
        received: list = []
        reader = threading.Thread(target=lambda: received.extend(sub.iter_messages(count=1, timeout_s=10)),
                                  name="test.reader")
        reader.start()
        assert pub.wait_for_subscribers(1, 5.0)
        pub.publish_detections("cam", detection("cam", 0))
        reader.join(10)
    assert [m.seq for m in received] == [0]


def test_a_reader_that_pauses_with_a_small_receive_queue_loses_nothing(publisher, endpoint):
    """A full receive queue must not end the connection: the reader pauses 8 s, then gets every message in order."""
    received: list[int] = []
    with Subscriber(endpoint, topics=("det/",), rcvhwm=10) as sub:
        def read() -> None:
            for message in sub.iter_messages(timeout_s=20):
                received.append(message.seq)
                if len(received) == 18:
                    time.sleep(8)  # longer than any heartbeat timeout; the queue of 10 is full meanwhile

        reader = threading.Thread(target=read, name="test.reader")
        reader.start()
        assert publisher.wait_for_subscribers(1, 5.0)
        total = 300
        for seq in range(total):  # about 10 s at 30 messages/s
            publisher.publish_detections("cam", detection("cam", seq, labels=("person",) * 30))
            time.sleep(1 / 30)
        deadline = time.monotonic() + 10
        while len(received) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.join(20)
    assert received == list(range(total)), f"{len(received)} received; unexplained gaps {sub.stats.unexplained_gaps}"
    assert publisher.dropped_hwm == 0
