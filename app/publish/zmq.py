"""ZeroMQ publisher of detection, status and event messages: per-subscriber HWM drops, counted.

Socket choice. Subscribers expect PUB behaviour: when one subscriber's queue
is full (``publish.sndhwm``), the message is dropped for that subscriber only,
and the others still get it, so a stalled reader never costs a fast one its
messages. A plain PUB socket does that silently, and libzmq reports no
per-pipe drop (neither a counter nor a socket-monitor event). So we use XPUB
and ask it, message by message, whether every matching subscriber has room:

* Each send goes first with ``XPUB_NODROP=1`` and ``NOBLOCK``. When all
  matching subscribers have room it is delivered to all (:attr:`sent`).
* When one of them is at its high-water mark, libzmq refuses it at once with
  ``zmq.Again`` (the postprocess thread never blocks). The publisher then
  turns ``XPUB_NODROP`` off for one send, which gives the message to every
  subscriber with room and drops it for the full ones only, and turns it back
  on. The message counts in :attr:`dropped_hwm` (messages that at least one
  subscriber missed), and the stream's next detection message carries it in
  ``dropped_before``, so the subscriber that missed it can explain its gap (one
  that got it sees ``dropped_before`` above its gap, which is not a loss).

What cannot be counted: how many subscribers missed a message, and which.
Drops after the publisher (a proxy's subscriber queue, the subscriber's own
``rcvhwm``) are invisible here; subscribers see them as unexplained gaps.

XPUB also delivers subscription frames to us; they are read (bounded) on
every publish so that they cannot pile up, and they let
:meth:`ZmqPublisher.wait_for_subscribers` wait for a slow joiner.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.auth

from app.config import PublishConfig
from app.errors import PublishError
from app.publish.messages import det_topic, encode, event_topic, status_topic

logger = logging.getLogger(__name__)

SUBSCRIPTION_READS_PER_PUBLISH = 64
"""At most this many subscription frames are read per publish call."""


def needs_ipv6(endpoint: str) -> bool:
    """True for a TCP endpoint with a bracketed IPv6 host (``tcp://[::1]:5555``).

    libzmq refuses those ("No such device") unless the socket has ``ZMQ_IPV6``
    set; it is set only for them, so ``tcp://*:5555`` keeps binding IPv4 only.
    """
    return endpoint.removeprefix("connect+").startswith("tcp://[")


class ZmqPublisher:
    """Publishes payload maps as ``[topic, payload]`` messages on one XPUB socket.

    The product's :class:`app.publish.base.Publisher`.

    Owned by ONE thread, the postprocess thread (``detstream.postprocess``):
    it creates (or is handed, before first use), uses and closes the
    publisher. ZeroMQ sockets are not thread-safe. ``context`` is shared
    when given (never terminated here); else the publisher owns its own.

    ``config.endpoint`` is bound, or connected when prefixed ``connect+``.
    """

    def __init__(self, config: PublishConfig, context: zmq.Context | None = None) -> None:
        self._config = config
        self._owns_context = context is None
        self._context = context if context is not None else zmq.Context()
        self._pending_drops: defaultdict[str, int] = defaultdict(int)
        self._subscriptions: defaultdict[bytes, int] = defaultdict(int)
        self._dropped_hwm = 0
        self._sent = 0
        self._closed = False
        self._socket = self._open_socket()

    def _open_socket(self) -> zmq.Socket:
        config = self._config
        endpoint = config.endpoint
        bare = endpoint.removeprefix("connect+")
        socket = self._context.socket(zmq.XPUB)
        try:
            socket.sndhwm = config.sndhwm  # before bind/connect: the HWM applies to later pipes only
            socket.linger = config.linger_ms
            socket.setsockopt(zmq.XPUB_NODROP, 1)
            socket.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, so counts stay exact
            socket.ipv6 = needs_ipv6(endpoint)
            if config.curve is not None:
                self._apply_curve(socket, config.curve.server_secret_file)
            if endpoint.startswith("connect+"):
                socket.connect(bare)
            else:
                socket.bind(bare)
        except zmq.ZMQError as error:
            socket.close(linger=0)
            self._close_context()
            verb = "connect to" if endpoint.startswith("connect+") else "bind"
            raise PublishError(f"cannot {verb} publish endpoint {bare}: {error.strerror}") from None
        except PublishError:
            socket.close(linger=0)
            self._close_context()
            raise
        logger.info("publishing on %s (%s)", endpoint, config.encoding)
        return socket

    @staticmethod
    def _apply_curve(socket: zmq.Socket, secret_file: str) -> None:
        try:
            public, secret = zmq.auth.load_certificate(secret_file)
        except (OSError, ValueError) as error:
            raise PublishError(f"cannot read CURVE certificate {secret_file}: {error}") from None
        if not secret:
            raise PublishError(f"CURVE certificate {secret_file} has no secret key (use the .key_secret file)")
        socket.curve_secretkey = secret
        socket.curve_publickey = public
        socket.curve_server = True

    def _close_context(self) -> None:
        if self._owns_context:
            self._context.term()

    @property
    def dropped_hwm(self) -> int:
        """Messages that at least one matching subscriber missed at its high-water mark (the others got them)."""
        return self._dropped_hwm

    @property
    def sent(self) -> int:
        """Messages delivered to every subscriber of the topic (0 subscribers counts too)."""
        return self._sent

    @property
    def subscriptions(self) -> int:
        """Active subscriptions seen (a subscriber to two topics counts twice; a proxy forwards its own)."""
        return sum(self._subscriptions.values())

    def publish_detections(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send a ``detstream.detections/1`` map on ``det/<stream_id>/``; False when a subscriber missed it at the HWM.

        Earlier HWM drops of the same stream are added to ``dropped_before``
        (on a copy; the caller's map is not modified).
        """
        pending = self._pending_drops.get(stream_id, 0)
        if pending:
            payload = {**payload, "dropped_before": int(payload.get("dropped_before", 0)) + pending}
        sent = self._send(det_topic(stream_id), payload)
        if sent:
            self._pending_drops.pop(stream_id, None)
        else:
            self._pending_drops[stream_id] = pending + 1
        return sent

    def publish_status(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send a ``detstream.status/1`` map on ``status/<stream_id>/``; False when a subscriber missed it."""
        return self._send(status_topic(stream_id), payload)

    def publish_event(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send a ``detstream.event/1`` map on ``event/<stream_id>/``; False when a subscriber missed it."""
        return self._send(event_topic(stream_id), payload)

    def _send(self, topic: bytes, payload: Mapping[str, Any]) -> bool:
        if self._closed:
            raise PublishError(f"publisher on {self._config.endpoint} is closed")
        self._read_subscriptions(SUBSCRIPTION_READS_PER_PUBLISH)
        data = encode(payload, self._config.encoding)
        try:
            self._socket.send_multipart([topic, data], flags=zmq.NOBLOCK)
        except zmq.Again:  # a matching subscriber is at its HWM: deliver to the others, drop for it only
            self._send_lossy(topic, data)
            self._dropped_hwm += 1
            logger.debug("dropped %s at the high-water mark (%d so far)", topic, self._dropped_hwm)
            return False
        self._sent += 1
        return True

    def _send_lossy(self, topic: bytes, data: bytes) -> None:
        """Send once with PUB semantics: every matching subscriber with room gets it, full ones do not."""
        self._socket.setsockopt(zmq.XPUB_NODROP, 0)
        try:
            self._socket.send_multipart([topic, data], flags=zmq.NOBLOCK)
        except zmq.Again:  # not expected without NODROP; the message is lost for everyone and counted as such
            logger.debug("dropped %s for every subscriber", topic)
        finally:
            self._socket.setsockopt(zmq.XPUB_NODROP, 1)

    def _read_subscriptions(self, limit: int) -> int:
        """Read up to ``limit`` waiting (un)subscription frames without blocking; how many were read."""
        count = 0
        while count < limit and self._socket.poll(0, zmq.POLLIN):
            frame = self._socket.recv(zmq.NOBLOCK)
            count += 1
            if not frame:
                continue
            topic = frame[1:]
            if frame[0] == 1:
                self._subscriptions[topic] += 1
            elif frame[0] == 0 and self._subscriptions.get(topic, 0) > 0:
                self._subscriptions[topic] -= 1
                if not self._subscriptions[topic]:
                    del self._subscriptions[topic]
        return count

    def wait_for_subscribers(self, min_count: int = 1, timeout_s: float = 1.0) -> bool:
        """Wait up to ``timeout_s`` until at least ``min_count`` subscriptions are active; True if they are.

        For file runs: a subscriber (or proxy) that connected just before we
        bound would otherwise miss the first messages (ZeroMQ's slow joiner).
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.subscriptions < min_count:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return False
            if self._socket.poll(min(remaining_ms, 100), zmq.POLLIN):
                self._read_subscriptions(SUBSCRIPTION_READS_PER_PUBLISH)
        return True

    def close(self) -> None:
        """Close the socket, waiting up to ``linger_ms`` for queued messages to go out. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._socket.close(linger=self._config.linger_ms)
        self._close_context()
        logger.info("publisher on %s closed: %d sent, %d dropped at the HWM", self._config.endpoint,
                    self._sent, self._dropped_hwm)

    def __enter__(self) -> ZmqPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
