"""The OpenVINO backend: :class:`OvEngine`, the default on a CPU (see :mod:`app.engines.selection`).

``engine`` is the :class:`~app.engines.base.Engine`; ``openvino`` itself is imported only when an engine is made.
"""

from app.engines.openvino.engine import OvEngine, openvino_cache_dir

__all__ = ["OvEngine", "openvino_cache_dir"]
