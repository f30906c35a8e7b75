"""Publishing results: the publisher and sink interfaces, message payloads, ZeroMQ, and the fan-in proxy.

:mod:`app.publish.base` holds the :class:`Publisher` and :class:`ResultSink`
interfaces; payload building and encoding are pure (:mod:`app.publish.messages`);
the :class:`ZmqPublisher` socket belongs to the postprocess thread.
"""

from app.publish.base import Publisher, ResultSink
from app.publish.messages import (
    DETECTION_SCHEMA,
    EVENT_SCHEMA,
    STATUS_SCHEMA,
    MessageDecodeError,
    decode,
    det_topic,
    detection_payload,
    encode,
    event_payload,
    event_topic,
    status_payload,
    status_topic,
    validate_detection,
    validate_event,
    validate_status,
)
from app.publish.proxy import ProxyThread, run_proxy
from app.publish.zmq import ZmqPublisher

__all__ = [
    "DETECTION_SCHEMA",
    "EVENT_SCHEMA",
    "STATUS_SCHEMA",
    "MessageDecodeError",
    "ProxyThread",
    "Publisher",
    "ResultSink",
    "ZmqPublisher",
    "decode",
    "det_topic",
    "detection_payload",
    "encode",
    "event_payload",
    "event_topic",
    "run_proxy",
    "status_payload",
    "status_topic",
    "validate_detection",
    "validate_event",
    "validate_status",
]
