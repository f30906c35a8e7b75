"""Model outputs → per-frame detections in frame pixels: decode, NMS, optional tracking.

Everything here runs on thread ``detstream.postprocess``.
"""

from app.postprocess.nms import batched_nms, nms_numpy, nms_opencv
from app.postprocess.tracking import StreamTrackers, TrackerSettings
from app.postprocess.yolo import MIN_SIDE_PX, check_layout, decode_batch

__all__ = [
    "MIN_SIDE_PX",
    "StreamTrackers",
    "TrackerSettings",
    "batched_nms",
    "check_layout",
    "decode_batch",
    "nms_numpy",
    "nms_opencv",
]
