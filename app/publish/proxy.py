"""The fan-in proxy behind ``detstream proxy``: workers publish into it, subscribers read from it.

::

    worker (XPUB, connect+tcp://proxy:5556) ─┐
    worker (XPUB, connect+tcp://proxy:5556) ─┼─► XSUB :5556 ══ proxy ══ XPUB :5555 ◄── subscribers
    worker ...                               ─┘

Subscriptions travel upstream (subscriber → XPUB → XSUB → workers), so a
worker only sends topics somebody wants. The backend drops per subscriber
at its high-water mark, so one stuck subscriber does not starve the others.

The proxy runs ``zmq.proxy_steerable`` on its own named thread
(``detstream.proxy``), which creates, binds and closes (``linger=0``) all
three of its sockets; :meth:`ProxyThread.stop` sends ``TERMINATE`` over an
inproc control socket of the stopping thread's own, so no socket is ever
touched from two threads and the context is never destroyed under a running
proxy.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
from types import FrameType

import zmq

from app.errors import PublishError
from app.publish.zmq import needs_ipv6

logger = logging.getLogger(__name__)

DEFAULT_HWM = 10000
_control_ids = itertools.count()


class ProxyThread(threading.Thread):
    """XSUB ``frontend`` (bound) → XPUB ``backend`` (bound) on thread ``detstream.proxy``.

    ``start()`` returns once both endpoints are bound, or raises
    :class:`PublishError` naming the endpoint that failed. ``stop()`` may be
    called from any thread, any number of times.
    """

    def __init__(self, frontend: str, backend: str, context: zmq.Context | None = None, hwm: int = DEFAULT_HWM) -> None:
        super().__init__(name="detstream.proxy", daemon=True)
        self.frontend = frontend
        self.backend = backend
        self._hwm = hwm
        self._owns_context = context is None
        self._context = context if context is not None else zmq.Context()
        self._control_endpoint = f"inproc://detstream-proxy-control-{next(_control_ids)}"
        self._ready = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopping = False
        self.error: BaseException | None = None

    def start(self, timeout_s: float = 5.0) -> None:  # type: ignore[override]
        super().start()
        if not self._ready.wait(timeout_s):
            raise PublishError(f"proxy {self.frontend} -> {self.backend} did not start within {timeout_s} s")
        if self.error is not None:
            self.join(timeout_s)
            self._term_context()
            raise self.error

    def _bind(self, socket: zmq.Socket, endpoint: str, role: str) -> None:
        try:
            socket.ipv6 = needs_ipv6(endpoint)
            socket.bind(endpoint)
        except zmq.ZMQError as error:
            raise PublishError(f"proxy cannot bind {role} {endpoint}: {error.strerror}") from None

    def run(self) -> None:
        frontend = self._context.socket(zmq.XSUB)
        backend = self._context.socket(zmq.XPUB)
        control = self._context.socket(zmq.PAIR)
        try:
            frontend.rcvhwm = self._hwm
            backend.sndhwm = self._hwm
            self._bind(frontend, self.frontend, "frontend")
            self._bind(backend, self.backend, "backend")
            control.bind(self._control_endpoint)
        except PublishError as error:
            self.error = error
        finally:
            self._ready.set()
        try:
            if self.error is None:
                logger.info("proxy running: workers -> %s, subscribers -> %s", self.frontend, self.backend)
                zmq.proxy_steerable(frontend, backend, None, control)
        except zmq.ContextTerminated:
            logger.warning("proxy stopped: its context was terminated")
        except Exception as error:  # the thread's one top-level handler
            logger.exception("proxy failed")
            self.error = error
        finally:
            for socket in (frontend, backend, control):
                socket.close(linger=0)
            logger.info("proxy stopped")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the proxy to terminate and wait for its thread; safe from any thread, idempotent.

        The TERMINATE sender stays open until the proxy thread has ended:
        closing it at once can discard the message before the proxy reads it.
        """
        with self._stop_lock:
            first = not self._stopping
            self._stopping = True
        if first and self.is_alive() and self.error is None:
            control = self._context.socket(zmq.PAIR)
            try:
                control.connect(self._control_endpoint)
                control.send(b"TERMINATE")
                self.join(timeout_s)
            finally:
                control.close(linger=0)
        self.join(timeout_s)
        if self.is_alive():
            logger.warning("proxy thread still running %s s after stop()", timeout_s)
            return
        self._term_context()

    def _term_context(self) -> None:
        """Terminate an owned context once every socket made from it is closed. Idempotent."""
        if self._owns_context and not self._context.closed:
            self._context.term()


def run_proxy(
    frontend: str,
    backend: str,
    stop_event: threading.Event | None = None,
    context: zmq.Context | None = None,
) -> None:
    """Run the proxy until ``stop_event`` is set or, on the main thread, SIGINT/SIGTERM arrives.

    Binds ``frontend`` (XSUB, workers connect) and ``backend`` (XPUB,
    subscribers connect); raises :class:`PublishError` when either cannot be
    bound. Returns after the proxy thread has closed its sockets.
    """
    stop = stop_event if stop_event is not None else threading.Event()
    proxy = ProxyThread(frontend, backend, context)
    previous = _install_signal_handlers(stop)
    try:
        proxy.start()
        while not stop.wait(0.2) and proxy.is_alive():
            pass
    finally:
        proxy.stop()
        _restore_signal_handlers(previous)
    if proxy.error is not None:
        raise PublishError(f"proxy {frontend} -> {backend} failed: {proxy.error}") from proxy.error


def _install_signal_handlers(stop: threading.Event) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("proxy: %s received, stopping", signal.Signals(signum).name)
        stop.set()

    return {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
