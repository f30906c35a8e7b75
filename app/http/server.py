""":class:`HttpServer`: the FastAPI app (:mod:`app.http.api`) on uvicorn, on a thread of its own.

Started by the runner before the model loads (a busy port fails fast), it
serves ``http.host:http.port``. Off loopback it refuses to start without a
token in the environment variable ``http.token_env`` (:class:`app.errors.ConfigError`),
because its control routes start and stop cameras. uvicorn's own access log
is off (detstream logs what the API changes); its signal handlers are not
installed (the runner owns signals).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import uvicorn

from app.control import SourceDiff
from app.errors import ConfigError
from app.http.api import create_app
from app.http.settings import HttpConfig
from app.http.view import ViewSink
from app.threads import StageThread

if TYPE_CHECKING:
    from app.pipeline import Pipeline

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64


def resolve_token(settings: HttpConfig, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token from ``settings.token_env``; required off loopback (ConfigError), optional on it."""
    value = (os.environ if env is None else env).get(settings.token_env, "").strip()
    if not value and not settings.loopback:
        raise ConfigError(f"http.host {settings.host}: serving off loopback needs a bearer token in the environment "
                          f"variable {settings.token_env} (http.token_env)")
    return value or None


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # uvicorn < 0.29; newer ones skip them off the main thread
        pass


class HttpServer:
    """uvicorn serving one pipeline's page and API on thread ``detstream.http``."""

    def __init__(self, pipeline: Pipeline, view: ViewSink, settings: HttpConfig, *,
                 reload: Callable[[], SourceDiff] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        token = resolve_token(settings, env)
        app = create_app(pipeline, view, settings, token=token, reload=reload)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, access_log=False, log_config=None,
                                lifespan="off", timeout_graceful_shutdown=1, limit_concurrency=MAX_CONNECTIONS,
                                server_header=False)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # its start-up lines repeat ours
        self._server = _Server(config)
        self._failure: BaseException | None = None
        self._thread = StageThread(self._serve, "detstream.http")

    def _serve(self) -> None:
        """Runs on ``detstream.http``. uvicorn ends a start-up it cannot bind with ``sys.exit``, the OS error
        as its context: kept for :meth:`start` to name, instead of escaping the thread."""
        try:
            self._server.run()
        except (SystemExit, OSError) as failure:
            self._failure = failure.__context__ if isinstance(failure, SystemExit) and failure.__context__ else failure

    def start(self) -> None:
        """Bind and serve; raises ConfigError when the address cannot be bound."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                reason = self._failure.strerror if isinstance(self._failure, OSError) else None
                raise ConfigError(f"http: cannot serve on {self.settings.host}:{self.settings.port} "
                                  f"({reason or 'address in use or not available'})")
            time.sleep(0.02)
        logger.info("live page on %s (API under /api)", self.url)

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one the OS chose for port 0)."""
        for server in self._server.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return self.settings.port

    @property
    def url(self) -> str:
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        return f"http://{host}:{self.port}/"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._server.should_exit = True
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)


__all__ = ["HttpServer", "resolve_token"]
