"""Publishing results over ZeroMQ: message payloads, the publisher, and the fan-in proxy.

Payload building and encoding are pure (:mod:`app.publish.messages`); the
:class:`ZmqPublisher` socket belongs to the postprocess thread.
"""

from app.publish.messages import (
    DETECTION_SCHEMA,
    STATUS_SCHEMA,
    MessageDecodeError,
    decode,
    det_topic,
    detection_payload,
    encode,
    status_payload,
    status_topic,
    validate_detection,
    validate_status,
)
from app.publish.proxy import ProxyThread, run_proxy
from app.publish.zmq import ZmqPublisher

__all__ = [
    "DETECTION_SCHEMA",
    "STATUS_SCHEMA",
    "MessageDecodeError",
    "ProxyThread",
    "ZmqPublisher",
    "decode",
    "det_topic",
    "detection_payload",
    "encode",
    "run_proxy",
    "status_payload",
    "status_topic",
    "validate_detection",
    "validate_status",
]
