"""The FastAPI app: the live page, the pictures, and runtime control of the sources.

Routes (JSON unless said otherwise)::

    GET    /                              the live page (static, shipped in the package)
    GET    /static/{name}                 its script and style sheet
    GET    /api/sources                   every source: state, counters, rates, masked URL
    GET    /api/sources/{id}              one source
    GET    /api/sources/{id}/snapshot.jpg the latest annotated picture (image/jpeg; 204 before the first)
    GET    /api/sources/{id}/stream.mjpg  annotated pictures as multipart/x-mixed-replace
    POST   /api/sources                   add a source (body: a config file's source entry)   [control]
    PATCH  /api/sources/{id}              change fields (max_fps, max_staleness_ms in place)  [control]
    DELETE /api/sources/{id}              stop and forget a source                            [control]
    POST   /api/reload                    re-read the config file, apply the difference       [control]

Errors are ``{"error": message, "field": name-or-null}``: 422 a body or URL
refused, 404 an unknown id, 409 a duplicate id, a full pipeline or one not
running, 413 a body over ``http.max_body_bytes``, 401 a missing or wrong
token, 403 a request from another web origin. Source URLs are only ever shown
masked (:func:`app.redact.redact_url`).

Browsers: on loopback only ``Host: localhost``/``127.0.0.1``/``[::1]`` is
served (a DNS-rebinding page cannot reach the API under its own name); a
request whose ``Origin`` is not the server itself is refused (another site's
page cannot add or remove cameras), and control bodies must be
``application/json`` (which a cross-site form cannot send without a preflight).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.config import SourceConfig
from app.control import ControlError, FieldError, SourceDiff
from app.errors import ConfigError
from app.http.policy import SourcePolicyError, check_source
from app.http.settings import HttpConfig
from app.http.view import ViewSink
from app.redact import redact_url

if TYPE_CHECKING:
    from app.pipeline import Pipeline

logger = logging.getLogger(__name__)

STATIC = resources.files("app.http") / "static"
_STATIC_TYPES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
                 "style.css": "text/css; charset=utf-8"}
BOUNDARY = "detstreamframe"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (no port, no IPv6 brackets)."""
    return (urlsplit(f"//{host_header}").hostname or "").lower()


class ApiError(Exception):
    """An error answer: HTTP ``status``, a message and the field it concerns."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def _validation_error(error: ValidationError) -> ApiError:
    """422 naming the first bad field; the input value is never echoed (it may hold a password)."""
    first = error.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    message = redact_url(str(first["msg"]).removeprefix("Value error, "))
    return ApiError(422, f"{field}: {message}" if field else message, field)


def create_app(pipeline: Pipeline, view: ViewSink, settings: HttpConfig, *, token: str | None = None,
               reload: Callable[[], SourceDiff] | None = None) -> FastAPI:
    """The app for one running ``pipeline``; ``token`` (when set) guards control routes, and view routes
    unless ``settings.public_view``; ``reload`` re-reads the config file (None: there is none)."""
    app = FastAPI(title="detstream", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse({"error": error.message, "field": error.field}, status_code=error.status)

    def authorize(request: Request, control: bool) -> None:
        host = request.headers.get("host", "")
        if settings.loopback and _host_name(host) not in LOOPBACK_NAMES:
            raise ApiError(403, "on loopback only localhost, 127.0.0.1 or [::1] is served")
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != host:
            raise ApiError(403, "requests from another web origin are refused")
        if token is None or (not control and settings.public_view):
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(401, "a valid 'Authorization: Bearer <token>' header is required")

    async def read_json(request: Request) -> Any:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("", "application/json"):
            raise ApiError(415, "body: send JSON with 'Content-Type: application/json'", "body")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > settings.max_body_bytes):
            raise ApiError(413, f"request body over {settings.max_body_bytes} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_body_bytes:
                raise ApiError(413, f"request body over {settings.max_body_bytes} bytes")
        try:
            return json.loads(body or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ApiError(422, f"body: not JSON ({error.__class__.__name__})") from None

    def describe(stream_id: str) -> dict[str, Any]:
        config = pipeline.source_configs().get(stream_id)
        if config is None:
            raise ApiError(404, f"no source {stream_id!r}", "id")
        snapshot = pipeline.streams().get(stream_id)
        rates = view.rates(stream_id)
        picture = view.picture(stream_id)
        out: dict[str, Any] = {"id": stream_id, "url": config.safe_url, "mode": config.effective_mode.value,
                               "max_fps": config.max_fps, "max_staleness_ms": config.max_staleness_ms,
                               "state": "connecting", "reason": "", "attempt": 0, "retry_in_s": None,
                               "frames": 0, "published": 0, "dropped": 0, "fps": rates.fps,
                               "p50_ms": rates.p50_ms, "p99_ms": rates.p99_ms,
                               "picture": picture.number if picture is not None else 0}
        if snapshot is not None:
            out.update(state=snapshot.state.value, reason=redact_url(snapshot.reason), attempt=snapshot.attempt,
                       retry_in_s=snapshot.retry_in_s, frames=snapshot.frames, published=snapshot.published,
                       dropped=snapshot.dropped)
        return out

    async def control(call: Callable[[], Any]) -> Any:
        try:
            return await run_in_threadpool(call)
        except ControlError as error:
            raise ApiError(error.status, str(error), "id") from None
        except ValidationError as error:
            raise _validation_error(error) from None
        except FieldError as error:
            raise ApiError(422, str(error), error.field) from None
        except (ConfigError, ValueError) as error:
            raise ApiError(422, redact_url(str(error))) from None

    # -- the page ----------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def page(request: Request) -> Response:
        authorize(request, control=False)
        return Response((STATIC / "index.html").read_bytes(), media_type=_STATIC_TYPES["index.html"])

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str, request: Request) -> Response:
        authorize(request, control=False)
        if name not in _STATIC_TYPES:
            raise ApiError(404, f"no static file {name!r}")
        return Response((STATIC / name).read_bytes(), media_type=_STATIC_TYPES[name])

    # -- views -------------------------------------------------------------------
    @app.get("/api/sources")
    async def list_sources(request: Request) -> dict[str, Any]:
        authorize(request, control=False)
        ids = list(pipeline.source_configs())
        return {"sources": [describe(sid) for sid in ids if sid in pipeline.source_configs()],
                "capacity": pipeline.capacity, "view_fps": settings.view_fps}

    @app.get("/api/sources/{stream_id}")
    async def get_source(stream_id: str, request: Request) -> dict[str, Any]:
        authorize(request, control=False)
        return describe(stream_id)

    @app.get("/api/sources/{stream_id}/snapshot.jpg")
    async def snapshot(stream_id: str, request: Request) -> Response:
        authorize(request, control=False)
        describe(stream_id)
        view.touch(stream_id)
        picture = view.picture(stream_id)
        if picture is None:
            return Response(status_code=204, headers={"Cache-Control": "no-store"})
        return Response(picture.jpeg, media_type="image/jpeg",
                        headers={"Cache-Control": "no-store", "X-Picture": str(picture.number)})

    @app.get("/api/sources/{stream_id}/stream.mjpg")
    async def mjpeg(stream_id: str, request: Request) -> StreamingResponse:
        authorize(request, control=False)
        describe(stream_id)
        return StreamingResponse(_pictures(stream_id, request),
                                 media_type=f"multipart/x-mixed-replace; boundary={BOUNDARY}",
                                 headers={"Cache-Control": "no-store"})

    async def _pictures(stream_id: str, request: Request) -> AsyncIterator[bytes]:
        view.watch(stream_id)
        try:
            last = 0
            while not pipeline.done() and stream_id in pipeline.source_configs():
                if await request.is_disconnected():
                    return
                picture = view.picture(stream_id)
                if picture is not None and picture.number != last:
                    last = picture.number
                    yield (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(picture.jpeg)}"
                           "\r\n\r\n").encode() + picture.jpeg + b"\r\n"
                await asyncio.sleep(0.5 / settings.view_fps)
        finally:
            view.unwatch(stream_id)

    # -- control -----------------------------------------------------------------
    @app.post("/api/sources", status_code=201)
    async def add_source(request: Request) -> dict[str, Any]:
        authorize(request, control=True)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(422, "body: a JSON object with the fields of a config file's source entry", "body")
        try:
            config = SourceConfig.model_validate(body)
            check_source(config, settings.allowed_paths)
        except ValidationError as error:
            raise _validation_error(error) from None
        except SourcePolicyError as error:
            raise ApiError(422, str(error), error.field) from None
        added = await control(lambda: pipeline.add_source(config))
        logger.info("api: source %s added (%s)", added.id, added.safe_url)
        return describe(added.id)

    @app.patch("/api/sources/{stream_id}")
    async def update_source(stream_id: str, request: Request) -> dict[str, Any]:
        authorize(request, control=True)
        body = await read_json(request)
        if not isinstance(body, dict) or not body:
            raise ApiError(422, "body: a JSON object of the source fields to change", "body")
        if "url" in body:
            raise ApiError(422, "url: cannot be changed (remove the source and add another)", "url")
        _, restarted = await control(lambda: pipeline.update_source(stream_id, body))
        return {**describe(stream_id), "restarted": restarted}

    @app.delete("/api/sources/{stream_id}")
    async def remove_source(stream_id: str, request: Request) -> dict[str, Any]:
        authorize(request, control=True)
        await control(lambda: pipeline.remove_source(stream_id))
        view.forget(stream_id)
        return {"id": stream_id, "state": "ended", "reason": "removed"}

    @app.post("/api/reload")
    async def reload_config(request: Request) -> dict[str, Any]:
        authorize(request, control=True)
        await read_json(request)
        if reload is None:
            raise ApiError(409, "nothing to reload: the run was not started from a config file (--config)")
        diff = await control(reload)
        for stream_id in diff.removed:
            view.forget(stream_id)
        return {"added": [s.id for s in diff.added], "removed": diff.removed, "changed": sorted(diff.changed)}

    return app


__all__ = ["ApiError", "create_app"]
