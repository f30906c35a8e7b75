"""HTTP exposition of one pipeline: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

Runs a :class:`http.server.ThreadingHTTPServer` on the daemon thread
``detstream.health`` (request handlers on short-lived daemon threads of the
server). It only ever *reads* pipeline state: three fixed routes, no query
parameters, no request bodies, nothing from a request is executed, evaluated
or logged above DEBUG. It binds ``metrics.host`` (default ``127.0.0.1``);
``0.0.0.0`` only when an operator configures it (containers).

``/healthz`` answers "is this process still doing its job?":

* 200 ``{"status": "ok", "published_recently": true, ...}`` while the
  postprocess thread (``detstream.postprocess``, the only publisher) is alive
  and its last publish or heartbeat is at most ``2 × publish.heartbeat_s`` old;
* 503 with ``"reason"`` otherwise (still starting, thread gone, publishing stalled).

``/readyz`` answers "should traffic/attention go here?": 200 once the engine
is loaded (``pipeline.ready``) and at least one source is ``running``;
503 with a JSON ``"reason"`` before that, or when every source is
reconnecting/ended/failed.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.errors import ConfigError
from app.redact import redact_url
from app.sources.base import SourceState
from app.threads import StageThread

if TYPE_CHECKING:
    from app.pipeline import Pipeline

logger = logging.getLogger(__name__)

HEARTBEAT_TOLERANCE = 2.0
"""``/healthz`` fails when nothing was published for this many heartbeat intervals."""

REQUEST_TIMEOUT_S = 5.0
"""A client that sends nothing for this long is disconnected (no thread is held forever)."""

_JSON = "application/json"


class HealthServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` of ``pipeline`` on ``host:port``.

    It reads only the pipeline's public state: ``metrics.registry``,
    ``ready`` (an Event), ``alive``, ``last_publish_at`` (None until started),
    ``publisher`` (its ``sent`` and ``dropped_hwm``), ``sink_failures``
    (an optional sink that stopped is reported, not failing), ``streams()`` and
    ``config.publish.heartbeat_s``. The server may be
    started before the pipeline: it then answers 503 "starting" until the
    pipeline is up. :meth:`start` and :meth:`stop` are idempotent; port 0
    picks a free port (see :attr:`port`).
    """

    def __init__(self, pipeline: Pipeline, host: str, port: int) -> None:
        self._pipeline = pipeline
        self._host = host
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one picked for port 0)."""
        return self._server.server_address[1] if self._server else self._port

    @property
    def address(self) -> str:
        return f"http://{self._host}:{self.port}"

    def start(self) -> None:
        """Bind and serve on thread ``detstream.health``; :class:`ConfigError` when the port cannot be bound."""
        with self._lock:
            if self._server is not None:
                return
            self._server = self._bind()
            self._thread = StageThread(self._server.serve_forever, "detstream.health", kwargs={"poll_interval": 0.2})
            self._thread.start()
        logger.info("metrics and health on %s (/metrics, /healthz, /readyz)", self.address)

    def _bind(self) -> ThreadingHTTPServer:
        server_class = _IPv6Server if ":" in self._host else _Server
        try:
            server = server_class((self._host, self._port), _handler_for(self))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ConfigError(f"metrics.port {self._port}: address already in use") from None
            if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
                raise ConfigError(f"metrics.host {self._host}: cannot bind here ({error.strerror or error})") from None
            if error.errno == errno.EACCES:
                raise ConfigError(f"metrics.port {self._port}: permission denied") from None
            raise ConfigError(f"metrics {self._host}:{self._port}: cannot bind ({error.strerror or error})") from None
        return server

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving, close the socket and join the thread. Idempotent, any thread."""
        with self._lock:
            server, thread = self._server, self._thread
            if server is None:
                return
            self._server, self._thread = None, None
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout_s)
        logger.debug("health server stopped")

    # -- the three answers (called on request threads; read-only) -----------
    def metrics_body(self) -> bytes:
        return generate_latest(self._pipeline.metrics.registry)

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of ``/healthz``."""
        pipeline = self._pipeline
        last_publish_at, publisher = pipeline.last_publish_at, pipeline.publisher
        limit_s = HEARTBEAT_TOLERANCE * pipeline.config.publish.heartbeat_s
        if last_publish_at is None or publisher is None:
            return 503, {"status": "starting", "published_recently": False, "reason": "pipeline not started yet"}
        age_s = max(0.0, time.monotonic() - last_publish_at)
        body: dict[str, Any] = {"status": "ok", "published_recently": age_s <= limit_s,
                                "last_publish_age_s": round(age_s, 3), "limit_s": limit_s,
                                "messages_sent": publisher.sent, "dropped_hwm": publisher.dropped_hwm,
                                "sink_failures": pipeline.sink_failures}
        if not pipeline.alive:
            body.update(status="failing", reason="postprocess thread is not running (run ended or crashed)")
            return 503, body
        if not body["published_recently"]:
            body.update(status="failing",
                        reason=f"nothing published for {age_s:.1f} s (limit {limit_s:.1f} s = 2 x heartbeat)")
            return 503, body
        return 200, body

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of ``/readyz``."""
        pipeline = self._pipeline
        if not pipeline.ready.is_set() or pipeline.last_publish_at is None:
            return 503, {"status": "not ready", "reason": "engine not loaded yet"}
        streams = pipeline.streams()
        states = {sid: s.state.value for sid, s in streams.items()}
        running = sorted(sid for sid, s in streams.items() if s.state is SourceState.RUNNING)
        body: dict[str, Any] = {"status": "ready" if running else "not ready", "sources": states}
        if running:
            return 200, body
        detail = ", ".join(f"{sid}: {state}" for sid, state in sorted(states.items())) or "no sources"
        body["reason"] = redact_url(f"no source is running ({detail})")
        return 503, body


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR: a restarted worker may bind while old connections sit in TIME_WAIT. On Linux it never
    # lets a second process listen on a port in use (that would need SO_REUSEPORT), so that still fails.
    allow_reuse_address = True
    request_queue_size = 16


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def _handler_for(owner: HealthServer) -> type[BaseHTTPRequestHandler]:
    """A handler class bound to one :class:`HealthServer` (no module-level state)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "detstream"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            route = self.path.split("?", 1)[0]
            try:
                if route == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, owner.metrics_body())
                elif route == "/healthz":
                    self._send_json(*owner.health())
                elif route == "/readyz":
                    self._send_json(*owner.readiness())
                else:
                    self._send_json(404, {"status": "not found", "paths": ["/metrics", "/healthz", "/readyz"]})
            except Exception:  # the request thread's one top-level handler: answer 500, never crash the server
                logger.exception("health endpoint %s failed", route)
                self._send_json(500, {"status": "error", "reason": "internal error (see the worker's log)"})

        def _send_json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, _JSON, (json.dumps(body) + "\n").encode())

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("health %s - %s", self.client_address[0], redact_url(format % args))

    return Handler


__all__ = ["HEARTBEAT_TOLERANCE", "HealthServer"]
