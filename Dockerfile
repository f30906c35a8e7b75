# syntax=docker/dockerfile:1
# detstream, CPU image (ONNX Runtime). Build: docker build -t detstream:cpu .
# Used for every role: `detstream run` (worker), `detstream proxy`, `detstream subscribe` (see docker-compose.yml).
#
# Base: Debian 12 with its own Python 3.11, so the image can be built wherever Debian's archive is reachable:
# from Docker Hub's debian:bookworm-slim, or from a root file system made with debootstrap and imported under
# that name (scripts/container_base.sh; the container tests build this very file that way).
# Behind a TLS-intercepting proxy, pass the proxy's CA bundle as a build secret; it is used by pip and never
# stored in a layer:  docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t detstream:cpu .
#
# Nothing is downloaded at build time beyond Debian and pip packages: the default model is fetched and
# converted on first start (`detstream models fetch`, or `detstream run` itself) into the volume /data/models,
# and downloads are cached in /data/cache ($DETSTREAM_CACHE). Mount both as volumes so a restart starts at once.
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml ./
# The dependencies of pyproject.toml, with ONNX Runtime's CPU build in place of onnxruntime-gpu: both install the
# same `onnxruntime` module, and the CPU one is a tenth of the size. A layer of its own, so that editing app/ or
# README.md reuses it.
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/venv/bin/python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d.replace('onnxruntime-gpu', 'onnxruntime') for d in deps))" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY README.md ./
COPY app ./app
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/python -c "import onnxruntime, app.cli; app.cli.build_parser()"

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DETSTREAM_CACHE=/data/cache \
    PATH=/opt/venv/bin:$PATH
# python3: the venv's interpreter; tini: PID 1, so SIGTERM reaches detstream, which drains and exits 0;
# libgomp1: ONNX Runtime's OpenMP. Package lists are kept on purpose: `detstream models fetch --clips` takes the
# demo clip from Debian's opencv-doc with `apt-get download`, which needs them but not root; gzipped, as in
# Docker Hub's Debian images, they take a tenth of the space.
RUN printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\nAcquire::Languages "none";\n' > /etc/apt/apt.conf.d/gzip-indexes \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3 tini libgomp1 \
    && apt-get clean

# A fixed non-root uid, so volumes and Kubernetes' runAsUser/fsGroup can name it.
RUN groupadd --system --gid 10001 detstream \
    && useradd --system --uid 10001 --gid detstream --home-dir /data --shell /usr/sbin/nologin detstream \
    && mkdir -p /data/models /data/cache /config \
    && chown -R detstream:detstream /data
COPY --from=build /opt/venv /opt/venv

USER detstream
WORKDIR /data
VOLUME ["/data/models", "/data/cache"]
# 9108: /metrics, /healthz, /readyz (only when --metrics-port is given and metrics.host allows it).
# 5555/5556: publish endpoint / proxy backend and frontend.
EXPOSE 9108 5555 5556

ENTRYPOINT ["tini", "--", "detstream"]
CMD ["--help"]
