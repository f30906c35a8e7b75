"""The XSUB/XPUB fan-in proxy: delivery from connect+ workers, clean stops, bind errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from app.config import PublishConfig
from app.errors import PublishError
from app.publish.messages import decode
from app.publish.proxy import ProxyThread, run_proxy
from app.publish.zmq import ZmqPublisher

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def endpoints(make_endpoint) -> tuple[str, str]:
    return make_endpoint(), make_endpoint()


def test_a_connect_plus_worker_reaches_a_subscriber_through_the_proxy(context, endpoints):
    frontend, backend = endpoints
    proxy = ProxyThread(frontend, backend)
    proxy.start()
    try:
        assert proxy.name == "detstream.proxy"
        sub = context.socket(zmq.SUB)
        sub.linger, sub.rcvtimeo = 0, 5000
        sub.subscribe(b"det/cam1/")
        sub.connect(backend)
        with ZmqPublisher(PublishConfig(endpoint=f"connect+{frontend}", linger_ms=0)) as worker:
            assert worker.wait_for_subscribers(1, 5.0)  # the subscription travelled back through the proxy
            worker.publish_detections("cam10", {"seq": 0})
            worker.publish_detections("cam1", {"seq": 1})
            topic, data = sub.recv_multipart()
        assert topic == b"det/cam1/" and decode(data, "json") == {"seq": 1}
    finally:
        proxy.stop()
    assert not proxy.is_alive() and proxy.error is None


def test_stop_is_idempotent_and_safe_from_another_thread(endpoints):
    proxy = ProxyThread(*endpoints)
    proxy.start()
    stopper = threading.Thread(target=proxy.stop, name="test.stopper")
    stopper.start()
    stopper.join(5)
    proxy.stop()
    assert not proxy.is_alive()


def test_run_proxy_returns_when_its_stop_event_is_set(endpoints):
    stop = threading.Event()
    runner = threading.Thread(target=run_proxy, args=(*endpoints, stop), name="test.run_proxy")
    runner.start()
    time.sleep(0.3)
    stop.set()
    runner.join(5)
    assert not runner.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "detstream.proxy"]


def test_a_busy_frontend_port_is_a_publish_error_naming_it(endpoints):
    frontend, backend = endpoints
    with ZmqPublisher(PublishConfig(endpoint=frontend, linger_ms=0)), pytest.raises(PublishError) as error:
        run_proxy(frontend, backend, threading.Event())
    assert frontend in str(error.value) and "frontend" in str(error.value)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_proxy_process_exits_cleanly_on_sigterm_and_sigint(signum, endpoints):
    frontend, backend = endpoints
    code = f"from app.publish.proxy import run_proxy; run_proxy({frontend!r}, {backend!r}); print('stopped')"
    # the repo goes first on the path, in front of (not instead of) any PYTHONPATH the caller set
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": python_path})
    try:
        deadline = time.monotonic() + 15
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as probe:  # wait until the backend is bound
            probe.linger = 0
            monitor = probe.get_monitor_socket(zmq.EVENT_CONNECTED)
            probe.connect(backend)
            assert monitor.poll(int((deadline - time.monotonic()) * 1000)), "proxy did not come up"
            probe.disable_monitor()
            monitor.close(linger=0)
        process.send_signal(signum)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, err.decode()
    assert out.strip() == b"stopped"
