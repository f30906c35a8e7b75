"""``detstream run``: turn arguments into a config, run the pipeline, map the outcome to an exit code.

Runs on the main thread, which also owns signal handling and the progress
display. First SIGINT/SIGTERM: stop sources, drain, publish, exit 0. Second:
exit at once (130). SIGHUP re-reads the config file (``--config``) and applies
the difference in sources (:meth:`app.pipeline.Pipeline.reload`), on the main
thread between progress updates; ``POST /api/reload`` does the same.

With ``http.enabled`` the live page and API (:mod:`app.http`) are served from
before the model loads until the run ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config import DetstreamConfig, config_warnings, load_config, parse_config, shard_of
from app.errors import ConfigError
from app.stop import StopRequest

if TYPE_CHECKING:
    from app.pipeline import Pipeline

logger = logging.getLogger("detstream")

DRAIN_TIMEOUT_S = 5.0
_ID_PREFIX = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$")


def parse_source_arg(text: str) -> dict[str, str]:
    """``[ID=]URL`` → a source tree; ``=`` inside a URL's query is not mistaken for an id."""
    match = _ID_PREFIX.match(text)
    if match and "://" not in match.group(1) and "/" not in match.group(1):
        return {"id": match.group(1), "url": match.group(2)}
    return {"url": text}


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not match or int(match.group(2)) < 1 or int(match.group(1)) >= int(match.group(2)):
        raise ConfigError(f"--shard: expected I/N with 0 <= I < N, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def _overrides(args: argparse.Namespace, tree: dict[str, Any]) -> dict[str, Any]:
    """Apply command-line options on top of a config tree (options win)."""
    if args.source:
        tree["sources"] = [parse_source_arg(s) for s in args.source]
    for source in tree.get("sources", []):
        if args.realtime:
            source["realtime"] = True
        if args.loop:
            source["loop"] = True
    sections = {"publish": {"endpoint": args.publish, "encoding": args.encoding},
                "engine": {"backend": args.engine, "max_batch": args.max_batch,
                           "precision": getattr(args, "precision", None)},
                "metrics": {"port": args.metrics_port}, "annotate": {"dir": args.annotate}}
    for section, values in sections.items():
        for key, value in values.items():
            if value is not None:
                tree.setdefault(section, {})[key] = value
    if args.model:
        looks_like_path = args.model.endswith(".onnx") or os.sep in args.model
        tree["model"] = {**tree.get("model", {}), "name": None if looks_like_path else args.model,
                         "path": args.model if looks_like_path else None}
    if args.duration is not None:
        tree["duration_s"] = args.duration
    if args.tracking:
        tree["tracking"] = args.tracking
    return tree


def build_config(args: argparse.Namespace) -> DetstreamConfig:
    """Config file (or the built-in demo, or defaults with --source) plus overrides."""
    if args.config:
        base = load_config(args.config).model_dump(mode="json", exclude_unset=True)
    elif args.source:
        base = {}
    else:
        from app.demo import demo_config

        base = demo_config().model_dump(mode="json", exclude_unset=True)
    return parse_config(_overrides(args, base), env={})


def _select_shard(config: DetstreamConfig, shard: str | None) -> DetstreamConfig | None:
    if not shard:
        return config
    index, count = parse_shard(shard)
    mine = [s for s in config.sources if shard_of(s.id, count) == index]
    logger.info("shard %d/%d: %d of %d sources (%s)", index, count, len(mine), len(config.sources),
                ", ".join(s.id for s in mine) or "none")
    if not mine:
        return None
    return config.model_copy(update={"sources": mine})


def _serve_metrics(config: DetstreamConfig, pipeline: Pipeline):
    if config.metrics.port is None:
        return None
    from app.health import HealthServer

    server = HealthServer(pipeline, config.metrics.host, config.metrics.port)
    server.start()
    return server


def _serve_http(config: DetstreamConfig, pipeline: Pipeline, view, args: argparse.Namespace):
    if view is None:
        return None
    from app.http.server import HttpServer

    reload = (lambda: pipeline.reload(reread_config(args))) if args.config else None
    server = HttpServer(pipeline, view, config.http, reload=reload)
    server.start()  # logs the page's URL
    return server


def _view_sink(config: DetstreamConfig, pipeline_spec):
    """The live page's picture sink when ``http.enabled`` (class names read once the model is loaded)."""
    if not config.http.enabled:
        return None
    from app.http.view import ViewSink

    return ViewSink(lambda: pipeline_spec().class_names, config.http.view_fps, config.http.jpeg_quality)


def reread_config(args: argparse.Namespace) -> DetstreamConfig:
    """The config file read again, with the same command-line overrides and shard as at start."""
    config = _select_shard(build_config(args), args.shard)
    if config is None:
        raise ConfigError("reload: no source of the re-read config falls in this shard")
    return config


class _Hangups:
    """SIGHUP requests a reload; the main loop applies it (a signal handler only sets a flag)."""

    def __init__(self) -> None:
        self.pending = threading.Event()
        self._previous = None

    def install(self) -> _Hangups:
        if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGHUP, lambda signum, frame: self.pending.set())
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGHUP, self._previous)
            self._previous = None


def _apply_hangup(pipeline: Pipeline, args: argparse.Namespace, view) -> None:
    if not args.config:
        logger.warning("SIGHUP: nothing to reload (no --config file)")
        return
    try:
        diff = pipeline.reload(reread_config(args))
    except Exception as error:  # a bad file or a refused change must not end the run
        logger.error("SIGHUP: reload refused: %s", error)
        return
    for stream_id in diff.removed if view is not None else ():
        view.forget(stream_id)


def run_command(args: argparse.Namespace, stop: StopRequest | None = None) -> int:
    """``stop``: the process's signal handling when ``python -m app`` installed it first; else installed here."""
    stop = stop or StopRequest().install()
    if stop.requested:  # a signal while the interpreter imported this module: nothing to undo
        return 0
    config = build_config(args)
    config = _select_shard(config, args.shard)
    if config is None or stop.requested:
        return 0
    from app.logs import setup_logging

    log_format = args.run_log_format or args.log_format or config.log.format
    setup_logging(args.log_level or config.log.level, log_format)
    for warning in config_warnings(config):
        logger.warning("%s", warning)
    _one_thread_per_stage()
    from app.pipeline import Pipeline

    view = _view_sink(config, lambda: pipeline.spec)  # called once frames flow: `pipeline` is bound by then
    pipeline = Pipeline(config, models_dir=args.models_dir, sinks=[view] if view is not None else ())
    stop.attach(pipeline)
    if stop.requested:  # nothing bound yet, so nothing to publish
        return 0
    # Before the model loads: a busy port fails fast, and /healthz answers "starting" meanwhile.
    server = _serve_metrics(config, pipeline)
    hangups = _Hangups().install()
    web = None
    try:
        web = _serve_http(config, pipeline, view, args)
        pipeline.start()
        drained = _wait(pipeline, config, interactive=False if args.no_progress else None,
                        on_hangup=(hangups.pending, lambda: _apply_hangup(pipeline, args, view)))
    finally:
        hangups.uninstall()
        pipeline.stop()
        pipeline.close()
        if web is not None:
            web.stop()
        if server is not None:
            server.stop()
    return _exit_code(pipeline, drained)


def _one_thread_per_stage() -> None:
    """This process's parallelism is its stage threads (a decoder per source, the inference contexts).

    OpenCV would also split each resize and colour conversion over a pool of its own: on 2 cores busy
    with inference that only adds hand-offs (measured 0.11 ms of CPU per 768x576 frame in its pool
    threads, for no gain). Process-wide, so it is set here, where the process is owned, not in Pipeline.
    """
    import cv2

    cv2.setNumThreads(1)


def _wait(pipeline: Pipeline, config: DetstreamConfig, interactive: bool | None, on_hangup=None) -> bool:
    """Show progress until the run ends; False when the drain had to be forced (frames may be lost).

    ``on_hangup``: (an event a SIGHUP sets, what to do then), run here on the main thread.
    """
    from app.stages.progress import ProgressReporter

    def total_frames(stream_id: str) -> int | None:
        source = next((s for s in pipeline.sources if s.stream_id == stream_id), None)
        return source.total_frames if source is not None else None

    started = time.monotonic()
    stop_at = None
    with ProgressReporter(pipeline.streams, total_frames, interactive=interactive) as progress:
        while not pipeline.done():
            if on_hangup is not None and on_hangup[0].is_set() and not pipeline.stopping:
                on_hangup[0].clear()
                on_hangup[1]()
            progress.update()
            now = time.monotonic()
            if config.duration_s is not None and now - started >= config.duration_s:
                pipeline.stop()
            if pipeline.stopping and stop_at is None:
                stop_at = now
            if stop_at is not None and now - stop_at > DRAIN_TIMEOUT_S:
                logger.warning("drain took more than %.0f s; forcing exit", DRAIN_TIMEOUT_S)
                pipeline.force_stop()
                pipeline.wait(2.0)
                return False
            time.sleep(0.2)
    return True


def counts_line(name: str, counts: Mapping[str, Any]) -> str:
    """``door: in 6 (person 6), out 3 (person 3), now 1 (person 1)``: one zone's or line's final counts."""
    parts = []
    for key, word in (("in", "in"), ("out", "out"), ("occupancy", "now")):
        if key in counts:
            labels = ", ".join(f"{label} {row[key]}" for label, row in sorted(counts["labels"].items()) if row[key])
            parts.append(f"{word} {counts[key]}" + (f" ({labels})" if labels else ""))
    return f"{name}: " + ", ".join(parts)


def _exit_code(pipeline: Pipeline, drained: bool = True) -> int:
    report = pipeline.report()
    for stream_id, count in report.published.items():
        logger.info("%s: published %d frames, dropped %d, %s", stream_id, count, report.dropped[stream_id],
                    report.states[stream_id].value)
        for name, counts in report.streams[stream_id].counts.items():
            logger.info("%s: %s", stream_id, counts_line(name, counts))
    for sink, reason in report.sink_failures.items():
        logger.warning("sink %s failed during the run: %s (detections were still published)", sink, reason)
    if not drained:
        print(f"detstream: error: frames in flight were not all published: the drain took over {DRAIN_TIMEOUT_S:.0f} s",
              file=sys.stderr)
        return 1
    if report.failed:
        for stream_id, reason in report.failed.items():
            print(f"detstream: error: source {stream_id!r} failed: {reason}", file=sys.stderr)
        return 1
    return 0


__all__ = ["Path", "build_config", "parse_shard", "parse_source_arg", "run_command"]
