"""CUDA for the engines and the frame ring: the :class:`~app.engines.cuda.device.Device` interface with its
``cuda-bindings`` implementation, and page-locked host memory (:mod:`app.engines.cuda.host_memory`).

A package of its own rather than part of ``tensorrt/``: TensorRT is its main user today, but the frame
ring's page-locked slots are not TensorRT's business, and ONNX Runtime's CUDA provider can feed from
pinned memory the same way. Neither backend imports the other; both may import this.
``cuda-bindings`` (≥ 12.9.1) is optional and imported only by :func:`~app.engines.cuda.device.import_cudart`.
"""
