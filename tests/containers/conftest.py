"""Builds the CPU image with podman and hands the container tests what they share.

These tests build and start the real containers, so they need podman (with runc), debootstrap and
podman-compose; ``make test-containers`` installs them and runs ``pytest -m containers tests/containers``.
``make test`` leaves them out (``-m "not containers"`` in pyproject's addopts).

The base image ``debian:bookworm-slim`` cannot be pulled here (no registry is reachable): it is made with
debootstrap by scripts/container_base.sh and ``podman build --pull=never`` builds the very Dockerfile users
build. Where HTTPS is intercepted by a proxy, the host's CA bundle ($DETSTREAM_CA_BUNDLE, default Debian's
/etc/ssl/certs/ca-certificates.crt) is the build secret ``ca`` and is mounted read-only for the model fetch,
as docs/operations.md tells users to do; TLS verification is never turned off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "detstream:cpu"  # the name docker-compose.yml runs
UID = 10001  # the fixed uid of the Dockerfile, which Kubernetes' runAsUser names too
CA_IN_CONTAINER = "/etc/detstream/ca.crt"  # where deploy/compose/ca-bundle.yml mounts the bundle


def pytest_collection_modifyitems(config, items):
    """Leave these tests out unless the -m expression names them: another -m (say `-m "not slow"`) replaces
    pyproject's `-m "not containers"`, and a plain test run must not need podman."""
    if "containers" in (config.getoption("markexpr") or ""):
        return
    ours = [item for item in items if item.get_closest_marker("containers")]
    if ours:
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if not item.get_closest_marker("containers")]


def ca_bundle() -> Path | None:
    path = Path(os.environ.get("DETSTREAM_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
    return path if path.is_file() else None


def ca_run_args() -> list[str]:
    """``podman run`` options that hand the CA bundle to pip, as deploy/compose/ca-bundle.yml does."""
    bundle = ca_bundle()
    if bundle is None:
        return []
    return ["-v", f"{bundle}:{CA_IN_CONTAINER}:ro", "-e", f"PIP_CERT={CA_IN_CONTAINER}",
            "-e", f"SSL_CERT_FILE={CA_IN_CONTAINER}", "-e", f"REQUESTS_CA_BUNDLE={CA_IN_CONTAINER}"]


def podman(*args: str, timeout_s: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s, **kwargs)
    if check and result.returncode != 0:
        output = result.stdout[-2000:] + result.stderr[-3000:]
        pytest.fail(f"podman {' '.join(args)}: exit {result.returncode}\n{output}")
    return result


def podman_compose() -> str:
    """podman-compose from $PODMAN_COMPOSE, beside this Python (the project venv) or on PATH."""
    candidates = [os.environ.get("PODMAN_COMPOSE", ""), str(Path(sys.executable).parent / "podman-compose"),
                  shutil.which("podman-compose") or ""]
    found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None:
        pytest.fail("podman-compose not found; `make test-containers` installs it")
    return found


def log(config: pytest.Config, line: str) -> None:
    """A line in the test log, also without -s (image size, build times)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"[containers] {line}")


@dataclass(frozen=True)
class Image:
    name: str
    size_mb: float
    build_s: float


@pytest.fixture(scope="session")
def image(request) -> Image:
    """The CPU image, built from the Dockerfile on the debootstrapped base, without pulling anything."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed; `make test-containers` installs it (scripts/container_setup.sh)")
    base = subprocess.run(["bash", str(ROOT / "scripts" / "container_base.sh")], capture_output=True, text=True,
                          timeout=600)
    assert base.returncode == 0, base.stderr[-3000:]
    secret = ["--secret", f"id=ca,src={ca_bundle()}"] if ca_bundle() else []
    started = time.monotonic()
    podman("build", "--pull=never", *secret, "-t", IMAGE, str(ROOT), timeout_s=900)
    build_s = time.monotonic() - started
    size = int(podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip())
    built = Image(IMAGE, size / 1e6, build_s)
    log(request.config, f"image {IMAGE}: {built.size_mb:.0f} MB, podman build took {build_s:.0f} s")
    return built


@dataclass(frozen=True)
class ModelVolumes:
    run_args: list[str]  # the --volume options for /data/models and /data/cache
    first_fetch_log: str  # what the first `detstream models fetch` on the fresh volumes printed


@pytest.fixture(scope="session")
def model_volumes(image, request) -> ModelVolumes:
    """Fresh named volumes for /data/models and /data/cache, filled by a first `detstream models fetch`."""
    names = ("detstream-test-models", "detstream-test-cache")
    for name in names:
        podman("volume", "rm", "-f", name, check=False)
        podman("volume", "create", name)
    request.addfinalizer(lambda: [podman("volume", "rm", "-f", name, check=False) for name in names])
    run_args = [f"--volume={names[0]}:/data/models", f"--volume={names[1]}:/data/cache"]
    first = podman("run", "--rm", *run_args, *ca_run_args(), IMAGE, "models", "fetch", "--models-dir",
                   "/data/models", timeout_s=600)
    return ModelVolumes(run_args, first.stdout + first.stderr)


@pytest.fixture
def container_name(request):
    """A fresh container name, removed (with its anonymous volumes) after the test."""
    name = f"detstream-test-{request.node.name[:40].replace('[', '-').replace(']', '')}-{os.getpid()}"
    podman("rm", "-f", "-v", name, check=False)
    yield name
    podman("rm", "-f", "-v", name, check=False)
