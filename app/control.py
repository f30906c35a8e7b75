"""Runtime control of a running pipeline's sources: the errors it answers with, and config differences.

:class:`app.pipeline.Pipeline` adds, removes and changes sources while it runs
(:meth:`~app.pipeline.Pipeline.add_source`, ``remove_source``,
``update_source``, ``reload``); the HTTP API (:mod:`app.http.api`) and
``SIGHUP`` (:mod:`app.runner`) call it. Errors::

    StateError (app.errors)
    └── ControlError            the operation is refused; ``status`` is its HTTP status
        ├── UnknownSourceError    no source has this id (404)
        ├── DuplicateSourceError  a source has this id already (409)
        ├── CapacityError         ``engine.max_sources`` sources run already (409)
        └── NotRunningError       before start, or stopping (409)
    ValueError
    └── FieldError              a source field the model cannot serve (422), e.g. an unknown ``classes:`` label
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.config import SourceConfig
from app.errors import StateError

LIVE_FIELDS = frozenset({"max_fps", "max_staleness_ms"})
"""Source fields a running source takes on without reconnecting; so do :data:`ANALYTICS_FIELDS`, and any other
change restarts the source."""


class ControlError(StateError):
    """A control operation refused; the message names the source and why."""

    status = 409


class UnknownSourceError(ControlError):
    status = 404


class DuplicateSourceError(ControlError):
    pass


class CapacityError(ControlError):
    pass


class NotRunningError(ControlError):
    pass


class FieldError(ValueError):
    """A source's field is valid on its own but not for this run; ``field`` is its path (``zones[0].classes``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


ANALYTICS_FIELDS = frozenset({"zones", "lines"})
"""Source fields the detector takes on while the source runs (:meth:`app.stages.detect.Detector.set_regions`)."""


@dataclass(frozen=True)
class SourceDiff:
    """What turns the running sources into a config's: ``changed`` maps an id to its new config."""

    added: list[SourceConfig] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, SourceConfig] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def summary(self) -> str:
        return (f"added {sorted(s.id for s in self.added) or 'none'}, removed {sorted(self.removed) or 'none'}, "
                f"changed {sorted(self.changed) or 'none'}")


def diff_sources(running: Mapping[str, SourceConfig], wanted: Sequence[SourceConfig]) -> SourceDiff:
    """Sources to add, remove and change so that ``running`` becomes ``wanted`` (ids decide identity)."""
    wanted_by_id = {s.id: s for s in wanted}
    diff = SourceDiff(added=[s for s in wanted if s.id not in running],
                      removed=[sid for sid in running if sid not in wanted_by_id])
    for sid, new in wanted_by_id.items():
        old = running.get(sid)
        if old is not None and old.model_dump() != new.model_dump():
            diff.changed[sid] = new
    return diff


def changed_fields(old: SourceConfig, new: SourceConfig) -> set[str]:
    """Names of the fields whose values differ."""
    before, after = old.model_dump(), new.model_dump()
    return {name for name in after if before.get(name) != after[name]}


__all__ = ["ANALYTICS_FIELDS", "LIVE_FIELDS", "CapacityError", "ControlError", "DuplicateSourceError",
           "FieldError", "NotRunningError", "SourceDiff", "UnknownSourceError", "changed_fields",
           "diff_sources"]
