"""ZmqPublisher on real loopback sockets: framing, exact topics, HWM drops, errors, CURVE."""

from __future__ import annotations

import itertools
import time

import pytest
import zmq
import zmq.auth

from app.config import CurveConfig, PublishConfig
from app.errors import PublishError
from app.publish.messages import decode
from app.publish.zmq import ZmqPublisher

TIMEOUT_MS = 5000


def sub_socket(context: zmq.Context, endpoint: str, *topics: bytes, rcvhwm: int = 1000) -> zmq.Socket:
    sub = context.socket(zmq.SUB)
    sub.rcvhwm = rcvhwm
    sub.rcvtimeo = TIMEOUT_MS
    sub.linger = 0
    for topic in topics:
        sub.subscribe(topic)
    sub.connect(endpoint)
    return sub


def publisher(endpoint: str, context: zmq.Context | None = None, **settings) -> ZmqPublisher:
    settings.setdefault("linger_ms", 0)
    return ZmqPublisher(PublishConfig(endpoint=endpoint, **settings), context)


def small_payload(seq: int, dropped_before: int = 0) -> dict:
    return {"schema": "detstream.detections/1", "seq": seq, "dropped_before": dropped_before}


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_plain_sub_socket_receives_topic_and_payload_frames(endpoint, context, encoding):
    with publisher(endpoint, encoding=encoding) as pub:
        sub = sub_socket(context, endpoint, b"det/", b"status/")
        assert pub.wait_for_subscribers(2, 5.0)
        assert pub.publish_detections("gate", small_payload(0))
        assert pub.publish_status("gate", {"schema": "detstream.status/1", "state": "running"})
        topic, data = sub.recv_multipart()
        assert topic == b"det/gate/" and decode(data, encoding) == small_payload(0)
        topic, data = sub.recv_multipart()
        assert topic == b"status/gate/" and decode(data, encoding)["state"] == "running"


def test_topic_filtering_is_exact_cam1_does_not_get_cam10(endpoint, context):
    with publisher(endpoint) as pub:
        sub = sub_socket(context, endpoint, b"det/cam1/")
        assert pub.wait_for_subscribers(1, 5.0)
        pub.publish_detections("cam10", small_payload(0))
        pub.publish_detections("cam1", small_payload(1))
        topic, data = sub.recv_multipart()
        assert topic == b"det/cam1/" and decode(data, "json")["seq"] == 1
        assert not sub.poll(200)


def test_a_subscriber_that_never_reads_neither_blocks_publishing_nor_grows_memory(endpoint, context):
    def rss_mb() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    blob = {"schema": "detstream.detections/1", "padding": "x" * 4000}  # 20000 × 4 kB = 80 MB offered
    with publisher(endpoint, sndhwm=100, encoding="msgpack") as pub:
        stuck = sub_socket(context, endpoint, b"det/", rcvhwm=100)
        assert pub.wait_for_subscribers(1, 5.0)
        before = rss_mb()
        started = time.monotonic()
        for _ in range(20000):
            pub.publish_detections("cam", blob)
        elapsed = time.monotonic() - started
        assert elapsed < 20.0
        assert pub.dropped_hwm > 0 and pub.sent + pub.dropped_hwm == 20000
        assert rss_mb() - before < 40.0
        stuck.close()


def test_drops_at_the_hwm_are_added_to_the_next_dropped_before_of_that_stream(endpoint, context):
    with publisher(endpoint, sndhwm=1) as pub:
        sub = sub_socket(context, endpoint, b"det/", rcvhwm=1)
        assert pub.wait_for_subscribers(1, 5.0)
        seq = 0
        deadline = time.monotonic() + 10
        while pub.dropped_hwm == 0 and time.monotonic() < deadline:  # fill kernel buffers and both queues
            pub.publish_detections("cam", small_payload(seq) | {"padding": "x" * 60000})
            seq += 1
        assert pub.dropped_hwm > 0
        received = []
        sent_after_drop = False
        deadline = time.monotonic() + 10
        while not sent_after_drop and time.monotonic() < deadline:  # read; publish one small frame per idle poll
            if sub.poll(50):
                received.append(decode(sub.recv_multipart()[1], "json"))
            else:
                sent_after_drop = pub.publish_detections("cam", small_payload(seq))
                seq += 1
        while sub.poll(1000):
            received.append(decode(sub.recv_multipart()[1], "json"))
        assert sent_after_drop
        seqs = [m["seq"] for m in received]
        for previous, message in itertools.pairwise(received):
            assert message["seq"] - previous["seq"] - 1 == message["dropped_before"], seqs
        assert any(m["dropped_before"] > 0 for m in received)


def test_the_callers_payload_is_not_modified_when_drops_are_added(endpoint):
    with publisher(endpoint) as pub:
        pub._pending_drops["cam"] = 3  # as after three HWM drops
        given = small_payload(7)
        pub.publish_detections("cam", given)
        assert given["dropped_before"] == 0 and "cam" not in pub._pending_drops


def test_binding_a_port_in_use_is_a_one_line_publish_error_naming_the_endpoint(endpoint):
    with publisher(endpoint), pytest.raises(PublishError) as error:
        publisher(endpoint)
    assert endpoint in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("bad", ["tcp://127.0.0.1:notaport", "tcp://256.1.1.1:5555", "connect+tcp://:"])
def test_a_bad_endpoint_is_a_publish_error(bad):
    with pytest.raises(PublishError, match="publish endpoint"):
        publisher(bad)


def test_close_is_idempotent_and_publishing_after_close_is_an_error(endpoint):
    pub = publisher(endpoint)
    pub.close()
    pub.close()
    with pytest.raises(PublishError, match="closed"):
        pub.publish_status("cam", {"state": "ended"})


def test_close_lingers_so_the_last_messages_are_delivered(endpoint, context):
    pub = publisher(endpoint, linger_ms=2000)
    sub = sub_socket(context, endpoint, b"det/")
    assert pub.wait_for_subscribers(1, 5.0)
    for seq in range(100):
        pub.publish_detections("cam", small_payload(seq))
    pub.close()
    seqs = [decode(sub.recv_multipart()[1], "json")["seq"] for _ in range(100)]
    assert seqs == list(range(100))


def test_wait_for_subscribers_gives_up_after_its_timeout(endpoint):
    with publisher(endpoint) as pub:
        started = time.monotonic()
        assert not pub.wait_for_subscribers(1, 0.3)
        assert 0.25 < time.monotonic() - started < 2.0


def test_unsubscribing_lowers_the_subscription_count(endpoint, context):
    with publisher(endpoint) as pub:
        sub = sub_socket(context, endpoint, b"det/a/", b"det/b/")
        assert pub.wait_for_subscribers(2, 5.0)
        sub.unsubscribe(b"det/a/")
        deadline = time.monotonic() + 5
        while pub.subscriptions != 1 and time.monotonic() < deadline:
            pub.publish_status("x", {"state": "running"})
            time.sleep(0.02)
        assert pub.subscriptions == 1


def test_curve_encrypts_for_subscribers_that_know_the_server_key(endpoint, context, tmp_path):
    public_file, secret_file = zmq.auth.create_certificates(tmp_path, "server")
    server_public, _ = zmq.auth.load_certificate(public_file)
    with publisher(endpoint, curve=CurveConfig(server_secret_file=str(secret_file))) as pub:
        sub = context.socket(zmq.SUB)
        sub.linger = 0
        sub.rcvtimeo = TIMEOUT_MS
        sub.curve_serverkey = server_public
        sub.curve_publickey, sub.curve_secretkey = zmq.curve_keypair()
        sub.subscribe(b"det/")
        sub.connect(endpoint)
        assert pub.wait_for_subscribers(1, 5.0)
        pub.publish_detections("cam", small_payload(0))
        assert sub.recv_multipart()[0] == b"det/cam/"


def test_a_curve_certificate_without_secret_key_is_a_publish_error(endpoint, tmp_path):
    public_file, _ = zmq.auth.create_certificates(tmp_path, "server")
    with pytest.raises(PublishError, match="no secret key"):
        publisher(endpoint, curve=CurveConfig(server_secret_file=str(public_file)))


def test_a_shared_context_is_left_running_after_close(endpoint, context):
    publisher(endpoint, context).close()
    assert not context.closed


def test_an_ipv6_loopback_endpoint_binds_and_delivers(context):
    import socket

    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        endpoint = f"tcp://[::1]:{probe.getsockname()[1]}"
    with publisher(endpoint, context) as pub:
        sub = context.socket(zmq.SUB)
        sub.ipv6, sub.linger, sub.rcvtimeo = True, 0, TIMEOUT_MS  # a SUB needs ZMQ_IPV6 before connecting too
        sub.subscribe(b"det/")
        sub.connect(endpoint)
        try:
            assert pub.wait_for_subscribers(1, 5.0)
            pub.publish_detections("cam", small_payload(0))
            assert sub.recv_multipart()[0] == b"det/cam/"
        finally:
            sub.close()


@pytest.mark.parametrize(("endpoint", "expected"), [("tcp://[::1]:5555", True), ("connect+tcp://[::1]:1", True),
                                                    ("tcp://127.0.0.1:5555", False), ("tcp://*:5555", False),
                                                    ("ipc:///tmp/x", False)])
def test_only_bracketed_ipv6_hosts_turn_on_zmq_ipv6(endpoint, expected):
    from app.publish.zmq import needs_ipv6

    assert needs_ipv6(endpoint) is expected


def test_a_stalled_subscriber_costs_a_healthy_one_nothing(endpoint, context):
    """One SUB never reads, one reads everything: the healthy one gets every message, the stall is counted."""
    blob = "x" * 4000
    total = 3000  # 12 MB: far beyond the stalled pipe's 50 messages plus the kernel's socket buffers
    with publisher(endpoint, sndhwm=50, encoding="msgpack") as pub:
        stalled = sub_socket(context, endpoint, b"det/", rcvhwm=50)
        healthy = sub_socket(context, endpoint, b"det/", rcvhwm=0)
        assert pub.wait_for_subscribers(2, 5.0)
        received: list[int] = []
        started = time.monotonic()
        for seq in range(total):
            if time.monotonic() - started > 30:
                break
            pub.publish_detections("cam", small_payload(seq) | {"padding": blob})
            while healthy.poll(100):  # the healthy subscriber keeps up: it reads each message as it comes
                received.append(decode(healthy.recv_multipart()[1], "msgpack")["seq"])
                if received[-1] >= seq:
                    break
        assert time.monotonic() - started < 30
        assert received == list(range(total)), f"healthy subscriber got {len(received)} of {total}"
        assert pub.dropped_hwm > 0, "the stalled subscriber's drops are counted"
        assert pub.sent + pub.dropped_hwm == total
        stalled.close()
