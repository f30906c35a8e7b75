"""The optional result sinks a config asks for, built in one place.

A new sink is a :class:`app.publish.base.ResultSink` in a module of its own
plus a line in :func:`build_sinks` (and one in :func:`check_sinks` when it
can fail before the model loads); the pipeline, the results stage and the
health server do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.config import DetstreamConfig
from app.publish.base import ResultSink
from app.stages.annotate import AnnotateSink, check_output_dir
from app.types import ModelSpec


def check_sinks(config: DetstreamConfig) -> None:
    """Refuse (:class:`app.errors.ConfigError`) what would make a configured sink fail, before the model loads."""
    if config.annotate.dir is not None:
        check_output_dir(config.annotate.dir)


def build_sinks(config: DetstreamConfig, spec: ModelSpec,
                total_frames: Callable[[str], int | None]) -> list[ResultSink]:
    """The sinks ``config`` asks for, not started. ``total_frames(stream_id)``: frames a source expects, if known."""
    sinks: list[ResultSink] = []
    if config.annotate.dir is not None:
        sinks.append(AnnotateSink(Path(config.annotate.dir), spec.class_names, config.annotate.snapshots,
                                  total_frames))
    return sinks


__all__ = ["build_sinks", "check_sinks"]
