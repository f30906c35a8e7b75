#!/usr/bin/env bash
# Makes the Debian 12 base image the CPU Dockerfile builds FROM, for machines that reach Debian's archive but
# no container registry: debootstrap --variant=minbase bookworm, trimmed the way Debian's -slim images are,
# imported into podman as docker.io/library/debian:bookworm-slim (the name `FROM debian:bookworm-slim` resolves
# to), so `podman build --pull=never` builds the very Dockerfile users build against Docker Hub's image.
#   container_base.sh [IMAGE]        nothing to do when IMAGE already exists in podman's storage
# The root file system is kept as a tarball in ~/.cache/detstream/ so a fresh podman storage imports it again
# without running debootstrap.
set -euo pipefail
image=${1:-docker.io/library/debian:bookworm-slim}
cache=${DETSTREAM_CACHE:-$HOME/.cache/detstream}
tarball=$cache/debian-bookworm-minbase.tar.gz
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if podman image exists "$image"; then
  echo "container_base: $image exists" >&2
  exit 0
fi
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  root=$(mktemp -d /var/tmp/detstream-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "container_base: debootstrap --variant=minbase bookworm ($mirror)" >&2
  debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
  # As in Debian's -slim images: no docs, man pages or translations from later installs; no .deb cache.
  cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
CFG
  printf 'APT::Install-Recommends "false";\n' > "$root/etc/apt/apt.conf.d/no-recommends"
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/usr/share/info/*
  tar -C "$root" --numeric-owner -c . | gzip -1 > "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
fi
echo "container_base: importing $tarball as $image" >&2
zcat "$tarball" | podman import --change 'CMD ["bash"]' - "$image" >/dev/null
