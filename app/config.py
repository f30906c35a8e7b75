"""The detstream configuration: pydantic models that only validate.

Loading is two steps, both pure: ``${VAR}`` interpolation over the parsed YAML
tree (so an unset variable is reported with its field path), then validation.
Every error is reported as ``field.path: message`` through :class:`ConfigError`
(both in :mod:`app.config_loading`). Every number is finite and bounded, every
string length too: the bounds are what a deployment needs, no more.
Defaults live in these models and only there; docs/configuration.md is written
from them. The ``engine`` section, with the deprecated flat keys it still reads,
is :mod:`app.engine_config`; its names are importable from here too.
"""

from __future__ import annotations

import hashlib
import os
import re
from enum import Enum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from app.analytics.config import LineConfig, ZoneConfig, check_region_names
from app.config_loading import StrictModel, format_validation_error, interpolate_env, shorten
from app.engine_config import MOVED_ENGINE_KEYS as MOVED_ENGINE_KEYS
from app.engine_config import EngineConfig
from app.engine_config import OnnxRuntimeConfig as OnnxRuntimeConfig
from app.engine_config import OpenVinoConfig as OpenVinoConfig
from app.engine_config import TensorRTConfig as TensorRTConfig
from app.errors import ConfigError
from app.http.settings import HttpConfig
from app.postprocess.layouts import LAYOUTS, known
from app.redact import redact_url, register_secret

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
_ID_PATTERN = r"^[A-Za-z0-9_.-]+$"

# Bounds a real deployment needs and no more: every number finite, every string short enough to log.
DAY_S = 86_400.0
YEAR_S = 366 * DAY_S
MIN_TIMEOUT_S = 0.1        # below this, a timeout only ever fires on a healthy source
MAX_ID_CHARS = 64          # like derived ids (derive_source_id)
MAX_PATH_CHARS = 4096      # PATH_MAX; URLs and endpoints too
MAX_HOST_CHARS = 255


class SourceMode(str, Enum):
    """What happens when the pipeline is behind.

    ``live``: drop the oldest waiting frame of that source (bounded latency; cameras).
    ``file``: block the decoder until there is room (lossless; recorded video).
    """

    LIVE = "live"
    FILE = "file"


class SourceKind(str, Enum):
    """Where frames come from; decides default mode and retry behaviour."""

    RTSP = "rtsp"
    HTTP = "http"
    FILE = "file"
    DEVICE = "device"


def source_kind(url: str) -> SourceKind:
    """Classify a source URL without touching the network or the disk."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in ("rtsp", "rtsps"):
        return SourceKind.RTSP
    if scheme in ("http", "https"):
        return SourceKind.HTTP
    if re.fullmatch(r"/dev/video\d+", url):
        return SourceKind.DEVICE
    return SourceKind.FILE


class BackoffConfig(StrictModel):
    """Reconnect delays: exponential with full jitter, reset after a stable period."""

    initial_s: float = Field(0.5, gt=0, le=DAY_S, description="first retry delay cap")
    max_s: float = Field(30.0, gt=0, le=DAY_S, description="largest retry delay cap")
    multiplier: float = Field(2.0, ge=1.0, le=100.0)
    reset_after_s: float = Field(30.0, ge=0, le=DAY_S, description="running this long resets the attempt count")


class SourceConfig(StrictModel):
    """One camera, stream or file."""

    id: str | None = Field(None, pattern=_ID_PATTERN, max_length=MAX_ID_CHARS,
                           description="unique id; default derived from the URL")
    url: str = Field(..., min_length=1, max_length=MAX_PATH_CHARS)
    mode: SourceMode | None = Field(None, description="live | file; default: file for files, live otherwise")
    max_fps: float | None = Field(None, gt=0, le=1000.0, description="decimate before inference (time based)")
    transport: Literal["tcp", "udp"] = "tcp"
    decode: Literal["cpu", "cuda"] = "cpu"
    realtime: bool = Field(False, description="pace a file at its own frame rate, like a camera")
    loop: bool = Field(False, description="restart a file at its end; seq continues")
    open_timeout_s: float = Field(10.0, ge=MIN_TIMEOUT_S, le=DAY_S, description="connecting, up to the stream's "
                                  "first data")
    read_timeout_s: float = Field(10.0, ge=MIN_TIMEOUT_S, le=DAY_S, description="a read that returns nothing for "
                                  "this long")
    stall_timeout_s: float = Field(10.0, ge=MIN_TIMEOUT_S, le=DAY_S, description="no frame for this long: reconnect")
    max_staleness_ms: float = Field(500.0, gt=0, le=DAY_S * 1000, description="live mode: older frames never reach "
                                    "the engine")
    reconnect: BackoffConfig = Field(default_factory=BackoffConfig)
    zones: list[ZoneConfig] = Field(default_factory=list, max_length=64, description="polygons to count tracks "
                                    "in, with enter/exit/dwell events (docs/analytics.md); turn tracking on")
    lines: list[LineConfig] = Field(default_factory=list, max_length=64, description="segments to count tracks "
                                    "crossing, in and out (docs/analytics.md); turn tracking on")

    @model_validator(mode="after")
    def _region_names(self) -> SourceConfig:
        check_region_names(self.zones, self.lines)
        return self

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if "://" in url:
            scheme = urlsplit(url).scheme.lower()
            if scheme not in (*NETWORK_SCHEMES, "file"):
                raise ValueError(
                    f"unsupported scheme {scheme!r} (use rtsp, rtsps, http, https, a file path or /dev/videoN)")
            if scheme in NETWORK_SCHEMES and not urlsplit(url).hostname:
                raise ValueError(f"malformed URL {redact_url(url)!r}: no host")
        elif url.startswith("/dev/") and not re.fullmatch(r"/dev/video\d+", url):
            raise ValueError(f"unsupported device {url!r} (use /dev/videoN)")
        elif url.startswith("~"):
            url = os.path.expanduser(url)
        return url

    @property
    def kind(self) -> SourceKind:
        return source_kind(self.url)

    @property
    def effective_mode(self) -> SourceMode:
        if self.mode is not None:
            return self.mode
        return SourceMode.FILE if self.kind is SourceKind.FILE and not self.realtime else SourceMode.LIVE

    @property
    def safe_url(self) -> str:
        return redact_url(self.url)


class ModelConfig(StrictModel):
    """Which detector to run and how to read its outputs."""

    name: str | None = Field("yolov3-tiny", description="a known model name (see `detstream models list`)")
    path: str | None = Field(None, description="an ONNX file; overrides name")
    format: str | None = Field(None, description="output layout, a name registered in app.postprocess.layouts "
                               "(see docs/models.md); default from the file's metadata, else from the output shape")
    names_file: str | None = Field(None, description="class names, one per line; default from metadata or COCO-80")
    conf_threshold: float = Field(0.25, ge=0, le=1)
    iou_threshold: float = Field(0.45, ge=0, le=1)
    classes: list[str] | None = Field(None, description="keep only these labels")
    max_detections: int = Field(300, ge=1)
    rect: bool = Field(True, description="letterbox each frame to the smallest multiple of the model's stride that "
                       "holds it (4:3 -> 416x320) instead of the full square input, when the model's input size is "
                       "dynamic and the engine accepts it; less padding, less compute")

    @field_validator("format")
    @classmethod
    def _registered_layout(cls, name: str | None) -> str | None:
        if name is not None and name not in LAYOUTS:
            raise ValueError(f"unknown output layout {name!r} (registered: {known()})")
        return name


class CurveConfig(StrictModel):
    """CURVE encryption of the result stream; keys are zmq certificate files."""

    server_secret_file: str = Field(..., max_length=MAX_PATH_CHARS)


class PublishConfig(StrictModel):
    """Where and how detections are published."""

    endpoint: str = Field("tcp://127.0.0.1:5555", max_length=MAX_PATH_CHARS)
    encoding: Literal["json", "msgpack"] = "json"
    sndhwm: int = Field(10000, ge=1, le=10_000_000, description="messages queued per subscriber before ZeroMQ drops")
    linger_ms: int = Field(2000, ge=0, le=60_000, description="at exit, wait this long for queued messages")
    heartbeat_s: float = Field(5.0, ge=0.1, le=DAY_S)
    startup_wait_s: float = Field(1.0, ge=0, le=60.0, description="wait this long for a first subscriber "
                                  "(slow joiner)")
    curve: CurveConfig | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint_shape(cls, endpoint: str) -> str:
        bare = endpoint.removeprefix("connect+")
        if not re.match(r"^(tcp|ipc|inproc)://.+", bare):
            raise ValueError(f"unsupported endpoint {endpoint!r} (use tcp://HOST:PORT, ipc://PATH, or connect+...)")
        return endpoint


class MetricsConfig(StrictModel):
    """Prometheus /metrics, /healthz and /readyz; off unless a port is given."""

    port: int | None = Field(None, ge=1, le=65535)
    host: str = Field("127.0.0.1", max_length=MAX_HOST_CHARS)


class AnnotateConfig(StrictModel):
    """Annotated MP4 per source plus a few JPEG snapshots, drawn off the hot path."""

    dir: str | None = Field(None, max_length=MAX_PATH_CHARS)
    snapshots: int = Field(5, ge=0, le=1000)


class LogConfig(StrictModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class DetstreamConfig(StrictModel):
    """The whole configuration file."""

    sources: list[SourceConfig] = Field(..., min_length=1)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    annotate: AnnotateConfig = Field(default_factory=AnnotateConfig)
    tracking: Literal["none", "bytetrack"] = "none"
    duration_s: float | None = Field(None, gt=0, le=YEAR_S, description="stop after this many seconds")
    log: LogConfig = Field(default_factory=LogConfig)
    http: HttpConfig = Field(default_factory=HttpConfig, description="the live page and the REST API (app.http)")

    @model_validator(mode="after")
    def _unique_ids(self) -> DetstreamConfig:
        seen: dict[str, int] = {}
        for index, source in enumerate(self.sources):
            if source.id is None:
                source.id = derive_source_id(source.url, index)
            if source.id in seen:
                raise ValueError(f"sources[{index}].id: duplicate id {source.id!r} (also sources[{seen[source.id]}])")
            seen[source.id] = index
        return self


def derive_source_id(url: str, index: int) -> str:
    """A readable, stable id for a source that has none: file stem or host_path."""
    if source_kind(url) is SourceKind.FILE:
        stem = Path(url.removeprefix("file://")).stem
    else:
        parts = urlsplit(url)
        stem = f"{parts.hostname or 'src'}{parts.path}"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_.") or f"source{index}"
    return slug[:64]


def shard_of(source_id: str, shards: int) -> int:
    """Stable shard number of a source id (same on every machine and Python run)."""
    digest = hashlib.sha256(source_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def parse_config(tree: Any, env: dict[str, str] | None = None) -> DetstreamConfig:
    """Validate an already-parsed YAML tree (after ``${VAR}`` interpolation)."""
    if not isinstance(tree, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(tree).__name__}")
    secrets: set[str] = set()
    resolved = interpolate_env(tree, dict(os.environ) if env is None else env, secrets=secrets)
    for secret in secrets:
        register_secret(secret)
    try:
        return DetstreamConfig.model_validate(resolved)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None


def load_config(path: str | Path, env: dict[str, str] | None = None) -> DetstreamConfig:
    """Read and validate a YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not a text (UTF-8) file") from None
    except OSError as error:
        raise ConfigError(f"{file}: cannot read config ({error.strerror or error})") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{file}: not valid YAML ({str(error).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{file}: YAML nested too deeply") from None
    return parse_config(tree, env)


def config_warnings(config: DetstreamConfig) -> list[str]:
    """Legal but probably unintended settings, one line each (logged once by `run` and `config check`)."""
    by_url: dict[str, list[str]] = {}
    for source in config.sources:
        by_url.setdefault(source.url, []).append(source.id or "")
    return [f"sources {', '.join(repr(i) for i in ids)} read the same URL {shorten(redact_url(url), 100)}: "
            "each decodes it separately" for url, ids in by_url.items() if len(ids) > 1]


def masked_dump(config: DetstreamConfig) -> str:
    """The resolved config as YAML with credentials masked, for `config check`."""
    data = config.model_dump(mode="json")
    for source in data["sources"]:
        source["url"] = redact_url(source["url"])
    return yaml.safe_dump(data, sort_keys=False)
