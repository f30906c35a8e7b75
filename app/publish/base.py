"""Where results go: the :class:`Publisher` of messages, and optional :class:`ResultSink`\\ s of frames.

The postprocess thread (``detstream.postprocess``) routes each published
frame and each source status to them; it knows nothing else about them.

* A :class:`Publisher` sends the ``detstream.detections/1``,
  ``detstream.status/1`` and ``detstream.event/1`` maps of docs/messages.md. There is one per pipeline;
  :class:`app.publish.zmq.ZmqPublisher` is the product's, tests pass their
  own to :class:`app.pipeline.Pipeline`. It is used and closed only on the
  postprocess thread (a ZeroMQ socket is not thread-safe).
* A :class:`ResultSink` receives every published :class:`FrameResult`
  (annotated video, ...). Sinks are optional: :func:`app.stages.sinks.build_sinks`
  builds those the config asks for, so a new sink touches that module and its
  own, not the pipeline. A sink does its work on a thread of its own;
  ``submit`` only hands the frame over. A sink never holds the pipeline:
  when its work fails it stops and says why in ``failure`` (its ``submit``
  then returns at once); a sink whose ``submit`` raises is detached. Either
  way it is logged once, named in ``/healthz`` and the run summary
  (``Pipeline.sink_failures``), and publishing goes on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from app.types import FrameResult


@runtime_checkable
class Publisher(Protocol):
    """Sends payload maps, one message each, per stream; never blocks the caller.

    ``sent`` counts messages handed to the transport; ``dropped_hwm`` those
    not sent because a consumer was at its queue limit (the high-water mark).
    A dropped detection message is still accounted for: the publisher adds it
    to the ``dropped_before`` of the stream's next detection message.
    """

    @property
    def sent(self) -> int: ...

    @property
    def dropped_hwm(self) -> int: ...

    def publish_detections(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send one detection map; False when dropped at the high-water mark."""
        ...

    def publish_status(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send one status map; False when dropped at the high-water mark."""
        ...

    def publish_event(self, stream_id: str, payload: Mapping[str, Any]) -> bool:
        """Send one zone or line event map; False when dropped at the high-water mark."""
        ...

    def wait_for_subscribers(self, min_count: int = 1, timeout_s: float = 1.0) -> bool:
        """Wait (bounded) until someone listens; True when they do. Called once, before the run starts."""
        ...

    def close(self) -> None:
        """Flush what is queued (bounded) and release the transport. Idempotent."""
        ...


class ResultSink(ABC):
    """An optional consumer of every published frame, with a thread of its own.

    Lifecycle, all driven by the pipeline: :meth:`start` before the first
    frame, :meth:`submit` for each published frame (on the postprocess
    thread), :meth:`close` at the end of the run (on the main thread, bounded
    by ``timeout_s``). ``dropped`` counts frames the sink gave up rather than
    slow the pipeline. ``needs_image``: the sink reads ``meta.image``, so
    decoders keep each original frame for it. ``failure`` is None while the
    sink works, else one line saying why it stopped (it then drops every frame).
    """

    name: str = "sink"
    needs_image: bool = False
    dropped: int = 0
    failure: str | None = None

    @abstractmethod
    def start(self) -> None:
        """Start the sink's thread."""

    @abstractmethod
    def submit(self, result: FrameResult, lossless: bool) -> None:
        """Hand over one published frame; runs on the postprocess thread.

        ``lossless`` is true for file sources: the sink should keep every frame
        (it may wait for room while it works; never once it has failed).
        Otherwise it drops and counts rather than wait. Raising detaches the
        sink for the rest of the run.
        """

    @abstractmethod
    def close(self, timeout_s: float = 30.0) -> None:
        """Finish what was handed over and release the sink's files and thread, within ``timeout_s``."""


__all__ = ["Publisher", "ResultSink"]
