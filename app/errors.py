"""The detstream error tree.

Callers catch at the level they care about::

    DetstreamError
    ├── ConfigError              bad YAML, bad field, unset ${VAR}; names the field path
    ├── ModelError               model file missing, not ONNX, layout mismatch, fetch failed
    ├── EngineError              an inference backend could not load or run
    │   └── EngineLoadError      a backend is unusable here (no GPU, missing package, ...)
    ├── SourceError              a source cannot be opened or read
    │   └── SourceConnectionError  classified network/file failure (see ``kind``)
    ├── PublishError             the publish endpoint cannot be bound/connected
    └── StateError               an operation not allowed in the current state

Every message is one line that names the offending thing (a path, a field, a
redacted URL) so that operators can act without reading a traceback.
"""

from __future__ import annotations


class DetstreamError(Exception):
    """Root of every error detstream raises on purpose."""


class ConfigError(DetstreamError):
    """The configuration is invalid; the message names the field path."""


class ModelError(DetstreamError):
    """A model file is missing, malformed, or its outputs match no known layout."""


class EngineError(DetstreamError):
    """An inference backend failed while running."""


class EngineLoadError(EngineError):
    """An inference backend cannot be used on this machine or with this model."""


class SourceError(DetstreamError):
    """A source could not be opened or read."""


class SourceConnectionError(SourceError):
    """A classified source failure.

    ``kind`` is one of the :class:`app.sources.failures.FailureKind` values
    (``refused``, ``timeout``, ``dns``, ``auth``, ``not_found``, ...), and
    ``retryable`` says whether reconnecting can help.
    """

    def __init__(self, message: str, kind: str, retryable: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


class PublishError(DetstreamError):
    """The publish endpoint could not be bound or connected."""


class StateError(DetstreamError):
    """An operation was attempted in a state that does not allow it."""
