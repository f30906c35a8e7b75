"""The fan-in topology for real: one `detstream proxy`, three `detstream run --shard I/3` workers publishing into
it, and one plain SUB on its backend connected before the workers start. Every stream must arrive exactly once,
from exactly one worker, with every frame and its `ended` status."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
import zmq

from app.config import shard_of
from tests.conftest import free_port, start_detstream, stop_process
from tests.integration.rtsp import make_clip

SHARDS = 3
PER_SHARD = 2
RUN_TIMEOUT_S = 90.0
SHARD_LINE = re.compile(r"shard (\d+)/(\d+): (\d+) of (\d+) sources \((.*)\)")


def ids_two_per_shard() -> list[str]:
    """Six readable ids, two in each of the three shards (shard_of is pinned, so this is stable)."""
    chosen: dict[int, list[str]] = defaultdict(list)
    for n in range(200):
        candidate = f"cam-{n:02d}"
        shard = shard_of(candidate, SHARDS)
        if len(chosen[shard]) < PER_SHARD:
            chosen[shard].append(candidate)
        if sum(map(len, chosen.values())) == SHARDS * PER_SHARD:
            return sorted(sid for group in chosen.values() for sid in group)
    raise AssertionError("no ids found")


class Subscriber:
    """SUB on the proxy backend, on its own thread; keeps (topic, payload) in arrival order."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.messages: list[tuple[str, dict]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test.shard.sub", daemon=True)

    def start(self) -> Subscriber:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def _run(self) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.linger = 0
            sub.rcvhwm = 0
            sub.subscribe(b"")
            sub.connect(self.endpoint)
            self._ready.set()
            while not self._stop.is_set():
                if sub.poll(100):
                    topic, payload = sub.recv_multipart()
                    self.messages.append((topic.decode(), json.loads(payload)))

    def ended(self) -> set[str]:
        return {p["stream"] for t, p in list(self.messages) if t.startswith("status/") and p["state"] == "ended"}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_listening(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listening on {port} after {timeout_s} s")


@pytest.fixture(scope="module")
def topology(tmp_path_factory, default_model):
    """Run the whole topology once; return what every process and the subscriber produced."""
    folder = tmp_path_factory.mktemp("shards")
    ids = ids_two_per_shard()
    frames = {sid: 20 + 3 * i for i, sid in enumerate(ids)}  # distinct lengths: a mix-up would show
    sources = [{"id": sid, "url": str(make_clip(folder / f"{sid}.mp4", frames=n, fps=10))} for sid, n in frames.items()]
    config = folder / "six-files.yaml"
    engine = {"max_batch": 4, "onnxruntime": {"intra_op_threads": 1}}
    config.write_text(yaml.safe_dump({"sources": sources, "engine": engine}))
    frontend, backend = free_port(), free_port()
    models_dir = str(Path(default_model).parent)
    proxy = start_detstream("proxy", "--frontend", f"tcp://127.0.0.1:{frontend}", "--backend",
                            f"tcp://127.0.0.1:{backend}")
    workers, subscriber = [], None
    try:
        wait_listening(backend)
        subscriber = Subscriber(f"tcp://127.0.0.1:{backend}").start()
        time.sleep(0.5)  # let the subscription reach the proxy before any worker connects
        workers = [start_detstream("run", str(config), "--shard", f"{i}/{SHARDS}", "--publish",
                                   f"connect+tcp://127.0.0.1:{frontend}", "--no-progress", "--models-dir", models_dir)
                   for i in range(SHARDS)]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and any(w.poll() is None for w in workers):
            time.sleep(0.2)
        settle = time.monotonic() + 3
        while subscriber.ended() != set(ids) and time.monotonic() < settle:
            time.sleep(0.1)
    finally:
        results = [stop_process(w, timeout_s=10) for w in workers]
        if subscriber is not None:
            subscriber.stop()
        proxy_result = stop_process(proxy, timeout_s=10)
    return {"ids": ids, "frames": frames, "workers": results, "proxy": proxy_result,
            "messages": subscriber.messages if subscriber else []}


def shard_claims(stderr: str) -> tuple[int, list[str]]:
    match = SHARD_LINE.search(stderr)
    assert match, stderr[-2000:]
    return int(match.group(1)), [s for s in match.group(5).split(", ") if s]


def test_every_worker_exits_0(topology):
    for code, _, err in topology["workers"]:
        assert code == 0, err[-2000:]


def test_the_workers_partition_the_six_streams_by_shard(topology):
    claims = [shard_claims(err) for _, _, err in topology["workers"]]
    assert sorted(index for index, _ in claims) == list(range(SHARDS))
    taken = [sid for _, ids in claims for sid in ids]
    assert sorted(taken) == topology["ids"], "each stream taken by exactly one worker"
    for index, ids in claims:
        assert all(shard_of(sid, SHARDS) == index for sid in ids)


def test_every_frame_of_every_stream_arrives_exactly_once(topology):
    seqs: dict[str, list[int]] = defaultdict(list)
    for topic, payload in topology["messages"]:
        if topic.startswith("det/"):
            assert topic == f"det/{payload['stream']}/"
            seqs[payload["stream"]].append(payload["seq"])
    assert sorted(seqs) == topology["ids"]
    missing = {sid: sorted(set(range(n)) - set(seqs[sid])) for sid, n in topology["frames"].items()}
    assert not any(missing.values()), f"frames missing at the subscriber (slow joiner?): {missing}"
    for sid, n in topology["frames"].items():
        assert seqs[sid] == list(range(n)), f"{sid}: duplicated or out of order"


def test_every_stream_ends_with_an_ended_status_after_its_last_detection(topology):
    messages = topology["messages"]
    for sid in topology["ids"]:
        last_det = max(i for i, (t, _) in enumerate(messages) if t == f"det/{sid}/")
        ended = [i for i, (t, p) in enumerate(messages) if t == f"status/{sid}/" and p["state"] == "ended"]
        assert ended, f"{sid}: no ended status"
        assert ended[-1] > last_det
        assert messages[ended[-1]][1]["frames"] == topology["frames"][sid]


def test_the_proxy_stops_cleanly_on_sigterm(topology):
    code, _, err = topology["proxy"]
    assert code == 0, err[-2000:]
