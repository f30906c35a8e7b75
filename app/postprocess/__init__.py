"""Model outputs → per-frame detections in frame pixels: layouts, decode, NMS, optional tracking.

``layouts/`` (one module per output layout and their registry), ``yolo``
(:func:`~app.postprocess.yolo.decode_batch`), ``nms``, ``tracking`` and
``bytetrack``. Everything here runs on thread ``detstream.postprocess``.
"""
