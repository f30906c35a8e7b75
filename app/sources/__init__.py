"""Frame sources: where frames come from (files, RTSP, HTTP/HLS, V4L2 devices).

:func:`create_source` is the only constructor the pipeline calls; every kind
is served by :class:`app.sources.pyav.PyAVSource`.
"""

from __future__ import annotations

from typing import Any

from app.config import SourceConfig
from app.sources.base import FrameSink, FrameSource, SourceState, SourceStatus, StatusCallback

__all__ = ["FrameSink", "FrameSource", "SourceState", "SourceStatus", "StatusCallback", "create_source"]


def create_source(config: SourceConfig, sink: FrameSink, on_status: StatusCallback, **options: Any) -> FrameSource:
    """A started-on-demand source for ``config`` feeding ``sink``; call ``start()`` to run it.

    ``options`` are :class:`app.sources.pyav.PyAVSource`'s keyword arguments, documented there: ``input_hw``
    (required: the model input ``(height, width)`` of the sink's slots), ``stride``, ``rect``, ``pixel_scale``,
    ``keep_image``. This function exists so that PyAV is imported only when a source is built.
    """
    from app.sources.pyav import PyAVSource

    return PyAVSource(config, sink, on_status, **options)
