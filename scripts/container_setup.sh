#!/usr/bin/env bash
# What `make test-containers` needs on a Debian machine, installed only when missing:
#   podman, runc and debootstrap (Debian packages), podman-compose and kubernetes-validate (PyPI, into the
#   venv given as $1),
#   and /etc/containers/containers.conf, written only when absent: runc as the runtime, and no default ulimits
#   (podman's defaults ask for more open files than an unprivileged container host may grant).
# Then the base image (scripts/container_base.sh), cached in podman's storage and ~/.cache/detstream/.
set -euo pipefail
venv=${1:-.venv}
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else echo "container_setup: not root and no sudo" >&2; exit 1; fi
fi
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "container_setup: installing ${need[*]}" >&2
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi
if [ ! -e /etc/containers/containers.conf ]; then
  echo "container_setup: writing /etc/containers/containers.conf" >&2
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' | $SUDO tee /etc/containers/containers.conf >/dev/null
fi
if [ ! -x "$venv/bin/podman-compose" ] || [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "container_setup: pip install podman-compose kubernetes-validate into $venv" >&2
  "$venv/bin/python" -m pip install -q podman-compose kubernetes-validate
fi
PATH=$PATH:/usr/sbin bash "$(dirname "$0")/container_base.sh"
