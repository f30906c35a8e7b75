"""Static checks of the container files (Docker does not run here): they parse, refer to files that exist,
run valid ``detstream`` commands with valid configs, and agree with each other on every endpoint and port."""

from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.cli import build_parser
from app.config import load_config

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
DETSTREAM_SERVICES = [name for name, svc in SERVICES.items() if svc.get("image", "").startswith("detstream")]
CAMERA_ENV = {"CAM_USER": "viewer", "CAM_PASSWORD": "not-a-real-password"}


def parse_detstream(argv: list[str]) -> argparse.Namespace:
    """What ``detstream ARGV`` would parse to; a usage error fails the test instead of exiting."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"`detstream {shlex.join(argv)}` is not a valid invocation (exit {error.code})")


def entrypoint(dockerfile: Path) -> list[str]:
    lines = [line for line in dockerfile.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, f"{dockerfile.name}: expected one ENTRYPOINT"
    return yaml.safe_load(lines[0].removeprefix("ENTRYPOINT "))


def command_of(name: str) -> argparse.Namespace:
    svc = SERVICES[name]
    command = svc["command"]
    assert isinstance(command, list), f"{name}: use the exec (list) form, so no shell sits between tini and detstream"
    assert entrypoint(ROOT / svc["build"]["dockerfile"]) == ["tini", "--", "detstream"]
    return parse_detstream(command)


def host_port(endpoint: str) -> tuple[str, int]:
    parts = urlsplit(endpoint.removeprefix("connect+"))
    assert parts.scheme == "tcp", endpoint
    return parts.hostname, parts.port


def mounts(name: str) -> list[tuple[str, str]]:
    """(source, target) of every volume of a service; sources starting with . or / are host paths."""
    pairs = []
    for entry in SERVICES[name].get("volumes", []):
        source, target = entry.split(":")[:2]
        pairs.append((source, target))
    return pairs


def host_path_for(name: str, container_path: str) -> Path:
    for source, target in mounts(name):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            assert source.startswith((".", "/")), f"{name}: {container_path} is on a named volume, not a host file"
            base = ROOT / source if source.startswith(".") else Path(source)
            return base / Path(container_path).relative_to(target)
    pytest.fail(f"{name}: {container_path} is not mounted from the host")


# -- files ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if "build" in s))
def test_every_build_context_and_dockerfile_exists(name):
    build = SERVICES[name]["build"]
    context = ROOT / build["context"]
    assert context.is_dir()
    assert (context / build.get("dockerfile", "Dockerfile")).is_file()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_mounted_host_file_exists(name):
    for source, target in mounts(name):
        if source.startswith((".", "/")):
            assert (ROOT / source).exists(), f"{name}: {source} (mounted at {target}) does not exist"
        else:
            assert source in COMPOSE["volumes"], f"{name}: named volume {source} is not declared"


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_the_images_copy_only_files_that_exist_and_are_not_dockerignored(dockerfile):
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip()[:1] not in ("", "#")]
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / dockerfile).read_text(), flags=re.M)
    sources = [source for line in copies for source in line.split()]
    assert {"pyproject.toml", "app"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is in .dockerignore"


@pytest.mark.parametrize(("dockerfile", "base"), [("Dockerfile", r"\$\{BASE\}"),
                                                  ("Dockerfile.gpu", r"nvcr\.io/nvidia/tensorrt:\$\{TRT_TAG\}")])
def test_the_images_run_as_a_non_root_user_with_the_data_volumes(dockerfile, base):
    text = (ROOT / dockerfile).read_text()
    assert re.search(rf"^FROM {base}$", text, flags=re.M)
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert "DETSTREAM_CACHE=/data/cache" in text
    assert re.search(r'^VOLUME \["/data/models", "/data/cache"\]$', text, flags=re.M)


def test_the_cpu_image_builds_on_debian_bookworm_and_leaves_its_build_stage_behind():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=debian:bookworm-slim$", text, flags=re.M)
    assert re.findall(r"^FROM (.+)$", text, flags=re.M) == ["${BASE} AS build", "${BASE}"]
    assert "COPY --from=build /opt/venv /opt/venv" in text
    final_stage = text.split("\nFROM ${BASE}\n")[1]
    assert "python3-venv" not in final_stage and "pip install" not in final_stage


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_the_images_run_detstream_under_tini(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert re.search(r"apt-get install -y --no-install-recommends [^\n]*\btini\b", text)
    assert entrypoint(ROOT / dockerfile) == ["tini", "--", "detstream"]


def test_a_ca_bundle_reaches_pip_only_as_a_build_secret_never_disabling_verification():
    text = (ROOT / "Dockerfile").read_text()
    pip_runs = [run for run in text.split("\nRUN ") if "pip install" in run]
    assert pip_runs and all(run.startswith("--mount=type=secret,id=ca,target=/run/secrets/ca") for run in pip_runs)
    assert all("PIP_CERT=/run/secrets/ca" in run for run in pip_runs)
    insecure = re.compile(r"trusted-host|--insecure|verify\s*=\s*False|PYTHONHTTPSVERIFY")
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        assert not insecure.search((ROOT / dockerfile).read_text()), dockerfile


def test_the_gpu_image_installs_the_tensorrt_extra_on_a_24_xx_base():
    text = (ROOT / "Dockerfile.gpu").read_text()
    assert re.search(r"^ARG TRT_TAG=24\.\d\d-py3$", text, flags=re.M)
    assert "pip install '.[tensorrt]'" in text


# -- commands and configs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DETSTREAM_SERVICES)
def test_every_command_is_a_valid_detstream_invocation(name):
    command_of(name)


def test_the_worker_config_is_mounted_from_configs_and_validates():
    args = command_of("worker")
    assert args.command == "run"
    config_file = host_path_for("worker", args.config)
    assert config_file == ROOT / "configs" / "worker.yaml"
    config = load_config(config_file, env=CAMERA_ENV)
    assert config.metrics.host == "0.0.0.0", "Prometheus in another container must reach the worker's metrics"


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_committed_config_validates(path):
    load_config(ROOT / "configs" / path, env=CAMERA_ENV)


def test_the_example_config_takes_the_camera_password_from_the_environment():
    text = (ROOT / "configs" / "example.yaml").read_text()
    assert "${CAM_PASSWORD}" in text
    config = load_config(ROOT / "configs" / "example.yaml", env={"CAM_PASSWORD": "from-env"})
    assert any("from-env" in s.url for s in config.sources)
    sections = {"sources", "model", "engine", "publish", "metrics"}
    assert sections <= yaml.safe_load(text).keys()


# -- endpoints and ports agree ----------------------------------------------------------------------------------------

def test_the_proxy_binds_all_interfaces_inside_the_compose_network():
    args = command_of("proxy")
    assert args.command == "proxy"
    assert host_port(args.frontend)[0] == "0.0.0.0" and host_port(args.backend)[0] == "0.0.0.0"


def test_workers_connect_to_the_proxy_frontend():
    proxy, worker = command_of("proxy"), command_of("worker")
    assert worker.publish.startswith("connect+")
    assert host_port(worker.publish) == ("proxy", host_port(proxy.frontend)[1])


def test_subscribers_connect_to_the_proxy_backend():
    proxy, recorder = command_of("proxy"), command_of("recorder")
    assert recorder.command == "subscribe" and recorder.format == "jsonl"
    assert host_port(recorder.endpoint) == ("proxy", host_port(proxy.backend)[1])
    out = str(recorder.out)
    on_volume = any(out.startswith(target.rstrip("/") + "/") for _, target in mounts("recorder"))
    assert on_volume, "--out must be on a volume"


def test_prometheus_scrapes_the_worker_metrics_port():
    prometheus = SERVICES["prometheus"]
    assert "monitoring" in prometheus.get("profiles", [])
    config_file = host_path_for("prometheus", "/etc/prometheus/prometheus.yml")
    scrape = yaml.safe_load(config_file.read_text())["scrape_configs"]
    port = command_of("worker").metrics_port
    targets = {f"{name}:{sd['port']}" for job in scrape for sd in job.get("dns_sd_configs", []) for name in sd["names"]}
    targets |= {t for job in scrape for static in job.get("static_configs", []) for t in static["targets"]}
    assert f"worker:{port}" in targets
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in scrape)


def test_the_worker_healthcheck_probes_its_metrics_port():
    port = command_of("worker").metrics_port
    probe = " ".join(SERVICES["worker"]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_ports_are_published_on_the_host_loopback_only(name):
    for mapping in SERVICES[name].get("ports", []):
        assert str(mapping).startswith("127.0.0.1:"), f"{name}: {mapping} would be reachable from the network"


def test_published_ports_match_what_the_services_listen_on():
    listening = {
        "proxy": {host_port(command_of("proxy").frontend)[1], host_port(command_of("proxy").backend)[1]},
        "worker": {command_of("worker").metrics_port},
        "prometheus": {9090},
    }
    for name, ports in listening.items():
        for mapping in SERVICES[name].get("ports", []):
            assert int(mapping.rsplit(":", 1)[1]) in ports, f"{name}: {mapping}"


def test_the_worker_waits_for_the_model_fetch_and_shares_its_volumes():
    assert SERVICES["worker"]["depends_on"]["models"]["condition"] == "service_completed_successfully"
    fetch = command_of("models")
    assert (fetch.command, fetch.models_command) == ("models", "fetch")
    assert str(fetch.models_dir) == str(command_of("worker").models_dir) == "/data/models"
    shared = {target for _, target in mounts("models")} & {target for _, target in mounts("worker")}
    assert {"/data/models", "/data/cache"} <= shared


def test_the_recorder_command_ends_with_exit_0_on_sigterm(tmp_path):
    """`docker compose down`/`podman-compose down` stop the recorder with SIGTERM; it closes its file and exits 0."""
    from tests.conftest import free_port, start_detstream, stop_process

    args = command_of("recorder")
    out = tmp_path / "detections.jsonl"
    proc = start_detstream("subscribe", f"tcp://127.0.0.1:{free_port()}", "--format", args.format, "--out", str(out))
    time.sleep(1.5)  # past start-up, into the receive loop
    code, _, err = stop_process(proc, signal.SIGTERM)
    assert code == 0, err
    assert out.exists()


def test_the_ca_bundle_override_hands_a_read_only_bundle_to_pip_in_the_model_fetch():
    override = yaml.safe_load((ROOT / "deploy" / "compose" / "ca-bundle.yml").read_text())
    assert set(override["services"]) <= set(SERVICES)
    models = override["services"]["models"]
    (mount,) = models["volumes"]
    source, target, mode = mount.rsplit(":", 2)
    assert source == "${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" and mode == "ro"
    assert models["environment"]["PIP_CERT"] == target
    assert command_of("models").command == "models"
