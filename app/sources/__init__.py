"""Frame sources: where frames come from (files, RTSP, HTTP/HLS, V4L2 devices).

:func:`create_source` is the only constructor the pipeline calls; every kind
is served by :class:`app.sources.pyav.PyAVSource`.
"""

from __future__ import annotations

from app.config import SourceConfig
from app.sources.base import FrameSink, FrameSource, SourceState, SourceStatus, StatusCallback

__all__ = ["FrameSink", "FrameSource", "SourceState", "SourceStatus", "StatusCallback", "create_source"]


def create_source(
    config: SourceConfig,
    sink: FrameSink,
    on_status: StatusCallback,
    *,
    input_hw: tuple[int, int],
    stride: int = 32,
    rect: bool = False,
    pixel_scale: float = 1.0 / 255.0,
    keep_image: bool = False,
) -> FrameSource:
    """A started-on-demand source for ``config`` feeding ``sink``; call ``start()`` to run it.

    ``input_hw`` is the model input ``(height, width)`` of the sink's slots; with ``rect``
    frames are letterboxed to the smallest multiple of ``stride`` that holds them.
    """
    from app.sources.pyav import PyAVSource  # PyAV is imported only when a source is built

    return PyAVSource(config, sink, on_status, input_hw=input_hw, stride=stride, rect=rect, pixel_scale=pixel_scale,
                      keep_image=keep_image)
