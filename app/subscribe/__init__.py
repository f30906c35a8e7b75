"""Reading detstream messages: a typed client (:class:`Subscriber`) and the ``detstream subscribe`` printer."""

from app.subscribe.client import DEFAULT_ENDPOINT, Subscriber, SubscriberStats
from app.subscribe.messages import Detection, DetectionMessage, EventMessage, GapEvent, Latency, Message, StatusMessage

__all__ = [
    "DEFAULT_ENDPOINT",
    "Detection",
    "DetectionMessage",
    "EventMessage",
    "GapEvent",
    "Latency",
    "Message",
    "StatusMessage",
    "Subscriber",
    "SubscriberStats",
]
