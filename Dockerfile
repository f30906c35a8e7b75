# detstream, CPU image (ONNX Runtime). Build: docker build -t detstream:cpu .
# Used for every role: `detstream run` (worker), `detstream proxy`, `detstream subscribe` (see docker-compose.yml).
#
# Nothing is downloaded at build time beyond pip packages: the default model is fetched and converted on
# first start (`detstream models fetch`, or `detstream run` itself) into the volume /data/models, and
# downloads are cached in /data/cache ($DETSTREAM_CACHE). Mount both as volumes so a restart starts at once.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DETSTREAM_CACHE=/data/cache

# Package lists are kept on purpose: `detstream models fetch --clips` takes the demo clip from Debian's
# opencv-doc with `apt-get download`, which needs them but not root. libgomp1: ONNX Runtime's OpenMP.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && apt-get clean

WORKDIR /opt/detstream
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install . \
    && python -c "import app.cli; app.cli.build_parser()"

# A fixed non-root uid, so volumes and Kubernetes' runAsUser/fsGroup can name it.
RUN groupadd --system --gid 10001 detstream \
    && useradd --system --uid 10001 --gid detstream --home-dir /data --shell /usr/sbin/nologin detstream \
    && mkdir -p /data/models /data/cache /config \
    && chown -R detstream:detstream /data

USER detstream
WORKDIR /data
VOLUME ["/data/models", "/data/cache"]
# 9108: /metrics, /healthz, /readyz (only when --metrics-port is given and metrics.host allows it).
# 5555/5556: publish endpoint / proxy backend and frontend.
EXPOSE 9108 5555 5556

ENTRYPOINT ["detstream"]
CMD ["--help"]
