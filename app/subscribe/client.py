"""A typed client for detstream publishers: iterate over detection and status messages.

::

    from app.subscribe import Subscriber, DetectionMessage

    with Subscriber("tcp://127.0.0.1:5555", streams=["gate"]) as sub:
        for message in sub.iter_messages(count=100, timeout_s=30):
            if isinstance(message, DetectionMessage):
                print(message.seq, message.label_counts())
        print(sub.stats, sub.gaps)

The socket belongs to the thread that iterates. ZeroMQ reconnects by itself
when the publisher restarts (every 100 ms, ``reconnect_ivl``, without backoff,
so a client started before the worker joins within its start-up wait), and TCP
keepalive notices a vanished peer host (about 10 s). Not ZMTP heartbeats: while
the receive queue is full (``rcvhwm`` reached by a reader that pauses), libzmq
stops reading the connection, so the heartbeat's answer goes unread, the
heartbeat times out, and the connection is dropped and made again, losing
everything in flight without a count on either side; a stale wake-up of the
old connection can then abort the process (``Assertion failed: _input_stopped``,
libzmq issues 3596 and 3937). A publisher that hangs is noticed by its
missing status heartbeats (``publish.heartbeat_s``). libzmq re-sends the
subscriptions after a reconnect only while the socket is in use, which
iterating does (it polls every 200 ms); a client that stops iterating for a
while may miss the first messages of a restarted publisher. A restarted
publisher starts its seqs again from 0; that is a restart, not a gap.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import zmq
import zmq.auth

from app.publish.messages import MessageDecodeError, decode
from app.publish.zmq import needs_ipv6
from app.subscribe.messages import DetectionMessage, EventMessage, GapEvent, Message, StatusMessage

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
MAX_GAP_EVENTS = 1000
_POLL_SLICE_MS = 200


@dataclass
class SubscriberStats:
    """Counters since the subscriber was opened."""

    received: int = 0
    detections: int = 0
    statuses: int = 0
    events: int = 0
    invalid: int = 0
    gaps: int = 0
    missing: int = 0
    unexplained_gaps: int = 0
    restarts: int = 0


def _server_key(curve_server_key: str | bytes | Path) -> bytes:
    """A z85 public key, given as the key itself or as a zmq certificate file."""
    if isinstance(curve_server_key, Path) or (isinstance(curve_server_key, str) and len(curve_server_key) != 40):
        public, _ = zmq.auth.load_certificate(str(curve_server_key))
        return public
    return curve_server_key.encode() if isinstance(curve_server_key, str) else curve_server_key


class Subscriber:
    """Subscribes to ``det/`` and ``status/`` messages (and ``event/`` when asked), optionally of some streams only.

    ``streams``: exact stream ids (``det/<id>/`` prefixes, so ``cam1`` does not
    match ``cam10``); empty means all. ``topics``: the topic families
    (``event/`` for zone and line events).
    ``encoding``: ``json``, ``msgpack``, or ``auto`` (a payload starting with
    ``{`` is JSON). ``curve_server_key``: the publisher's public key (z85 or a
    certificate file) when it uses CURVE; this client uses a fresh key pair.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        streams: Sequence[str] = (),
        topics: Sequence[str] = ("det/", "status/"),
        encoding: Literal["auto", "json", "msgpack"] = "auto",
        curve_server_key: str | bytes | Path | None = None,
        context: zmq.Context | None = None,
        rcvhwm: int = 10000,
    ) -> None:
        if encoding not in ("auto", "json", "msgpack"):
            raise ValueError(f"unknown encoding {encoding!r} (use auto, json or msgpack)")
        self.endpoint = endpoint
        self.encoding = encoding
        self.stats = SubscriberStats()
        self.gaps: deque[GapEvent] = deque(maxlen=MAX_GAP_EVENTS)
        self._next_seq: dict[str, int] = {}
        self._owns_context = context is None
        self._context = context if context is not None else zmq.Context()
        self._closed = False
        self._socket = self._context.socket(zmq.SUB)
        try:
            self._configure(rcvhwm, curve_server_key)
            self.subscriptions = [f"{t}{s}/" for t in topics for s in streams] if streams else list(topics)
            for prefix in self.subscriptions:
                self._socket.subscribe(prefix.encode())
            self._socket.connect(endpoint)
        except (zmq.ZMQError, OSError, ValueError) as error:
            self.close()
            raise ValueError(f"cannot subscribe to {endpoint}: {error}") from None

    def _configure(self, rcvhwm: int, curve_server_key: str | bytes | Path | None) -> None:
        socket = self._socket
        socket.linger = 0
        socket.rcvhwm = rcvhwm
        socket.reconnect_ivl = 100
        socket.reconnect_ivl_max = 0  # no backoff (ZeroMQ default): a client started first must not miss frames
        socket.tcp_keepalive = 1  # not ZMTP heartbeats: they time out while a paused reader's queue is full
        socket.tcp_keepalive_idle = 4
        socket.tcp_keepalive_intvl = 2
        socket.tcp_keepalive_cnt = 3
        socket.ipv6 = needs_ipv6(self.endpoint)
        if curve_server_key is not None:
            public, secret = zmq.curve_keypair()
            socket.curve_serverkey = _server_key(curve_server_key)
            socket.curve_publickey = public
            socket.curve_secretkey = secret

    def __iter__(self) -> Iterator[Message]:
        return self.iter_messages()

    def iter_messages(self, count: int | None = None, timeout_s: float | None = None) -> Iterator[Message]:
        """Yield up to ``count`` messages, for at most ``timeout_s`` seconds (None: no limit).

        Malformed or invalid payloads are skipped and counted in ``stats.invalid``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        yielded = 0
        while count is None or yielded < count:
            wait_ms = _POLL_SLICE_MS
            if deadline is not None:
                wait_ms = min(wait_ms, int((deadline - time.monotonic()) * 1000))
                if wait_ms <= 0:
                    return
            if not self._socket.poll(wait_ms, zmq.POLLIN):
                continue
            message = self._read_one()
            if message is not None:
                yielded += 1
                yield message

    def _read_one(self) -> Message | None:
        frames = self._socket.recv_multipart(zmq.NOBLOCK)
        self.stats.received += 1
        try:
            if len(frames) != 2:
                raise MessageDecodeError(f"expected 2 frames (topic, payload), got {len(frames)}")
            topic, data = frames
            payload = decode(data, self._encoding_of(data))
            if topic.startswith(b"det/"):
                message: Message = DetectionMessage.from_payload(payload)
            elif topic.startswith(b"status/"):
                message = StatusMessage.from_payload(payload)
            elif topic.startswith(b"event/"):
                message = EventMessage.from_payload(payload)
            else:
                raise MessageDecodeError(f"unknown topic {topic[:64]!r}")
        except ValueError as error:
            self.stats.invalid += 1
            logger.warning("skipped a message from %s: %s", self.endpoint, str(error)[:300])
            return None
        if isinstance(message, DetectionMessage):
            self.stats.detections += 1
            self._track_seq(message)
        elif isinstance(message, EventMessage):
            self.stats.events += 1
        else:
            self.stats.statuses += 1
        return message

    def _encoding_of(self, data: bytes) -> Literal["json", "msgpack"]:
        if self.encoding != "auto":
            return self.encoding
        return "json" if data[:1] == b"{" else "msgpack"

    def _track_seq(self, message: DetectionMessage) -> None:
        expected = self._next_seq.get(message.stream)
        self._next_seq[message.stream] = message.seq + 1
        if expected is None:
            return
        if message.seq < expected:
            self.stats.restarts += 1
            logger.info("stream %s restarted its seqs (%d after %d)", message.stream, message.seq, expected - 1)
            return
        if message.seq == expected and message.dropped_before == 0:
            return
        gap = GapEvent(message.stream, expected, message.seq, message.dropped_before)
        self.gaps.append(gap)
        self.stats.gaps += 1
        self.stats.missing += gap.missing
        if not gap.explained:
            self.stats.unexplained_gaps += 1
            logger.warning("stream %s: %d messages missing before seq %d, publisher reported %d dropped",
                           gap.stream, gap.missing, gap.seq, gap.dropped_before)

    @property
    def last_gap(self) -> GapEvent | None:
        return self.gaps[-1] if self.gaps else None

    def close(self) -> None:
        """Close the socket (no linger) and the context it owns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._socket.close(linger=0)
        if self._owns_context:
            self._context.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
