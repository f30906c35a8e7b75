"""detstream: streaming object detection from cameras and files, published over ZeroMQ."""

__version__ = "0.1.0"
