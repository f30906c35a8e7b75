"""The ONNX Runtime backend: :class:`OrtEngine` on the CPU, CUDA or TensorRT execution provider.

``engine`` is the :class:`~app.engines.base.Engine`; ``session`` picks the provider and the threads;
``workers`` runs single frames concurrently on the CPU provider; ``outputs`` holds the preallocated
output sets. ``onnxruntime`` itself is imported only when an engine is made.
"""

from app.engines.onnxruntime.engine import OrtEngine, dynamic_batch_sizes
from app.engines.onnxruntime.session import CPU, intra_op_threads, physical_cores

__all__ = ["CPU", "OrtEngine", "dynamic_batch_sizes", "intra_op_threads", "physical_cores"]
