"""The TensorRT backend: a deserialized engine run on several execution contexts, built and cached on demand.

Modules, by job: ``engine`` (:class:`TensorRTEngine` and :func:`open_tensorrt_engine`, the whole "try
TensorRT" path), ``scheduler`` (batches onto contexts, CUDA graphs, in-order results), ``profiles``
(optimization profiles and batch buckets), ``runtime`` (the seam: what the engine asks of TensorRT),
``adapter`` (that seam on the real ``tensorrt`` module), ``precision`` (which ONNX file a precision
builds from), ``build`` (ONNX → serialized engine, strongly typed), ``cache`` (engine files keyed by
model content, TensorRT, GPU and settings) and ``prebuild`` (the ``build-engine`` command).

Nothing here imports ``tensorrt`` at import time: :func:`app.engines.tensorrt.adapter.import_tensorrt`
does, when an engine is asked for, so this package loads on machines without TensorRT.
"""

from app.engines.tensorrt.engine import TensorRTEngine, open_tensorrt_engine

__all__ = ["TensorRTEngine", "open_tensorrt_engine"]
