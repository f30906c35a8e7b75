"""RTSP peers that are slow in one phase: a silent server, and a proxy that delays or freezes a real one.

Plain TCP on loopback, one daemon thread per connection direction; ``close()``
ends everything. The proxy sits in front of ``scripts/rtsp_server.py`` (RTSP
over TCP interleaves media on the same connection, so one socket pair carries
the whole session).
"""

from __future__ import annotations

import socket
import threading
import time

from tests.integration.rtsp import LoopbackPeer


class SilentServer(LoopbackPeer):
    """Accepts TCP connections and never sends a byte (a camera that hangs before answering)."""

    thread_name = "test.silent"

    def __init__(self) -> None:
        self._conns: list[socket.socket] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        self._conns.append(conn)

    def close(self) -> None:
        super().close()
        for conn in self._conns:
            conn.close()


class SlowProxy:
    """Forwards to ``127.0.0.1:upstream_port``; the server's first reply waits ``first_reply_delay_s``.

    ``freeze()`` stops forwarding the server's bytes (the connection stays open): a camera that goes
    silent after PLAY.
    """

    def __init__(self, upstream_port: int, first_reply_delay_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.first_reply_delay_s = first_reply_delay_s
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._frozen = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="test.proxy", daemon=True)
        self._thread.start()

    def url(self, path: str = "/cam") -> str:
        return f"rtsp://127.0.0.1:{self.port}{path}"

    def freeze(self) -> None:
        self._frozen.set()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            self._conns += [client, upstream]
            for src, dst, from_server in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, from_server), name="test.proxy.pump",
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        delay_s = self.first_reply_delay_s if from_server else 0.0
        src.settimeout(0.2)
        first = True
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            if first and delay_s and self._stop.wait(delay_s):
                return
            first = False
            if from_server and self._frozen.is_set():
                continue  # swallowed: the client hears nothing more
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        time.sleep(0.3)  # pumps notice the stop within their 0.2 s receive timeout
        for conn in self._conns:
            conn.close()
        self._sock.close()
