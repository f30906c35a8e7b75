"""The ``engine`` section of the configuration: backend choice, batching, and each backend's own settings.

Each backend has its own section (``engine.tensorrt``, ``engine.onnxruntime``,
``engine.openvino``). The flat ``engine.*`` keys of the previous release
(:data:`MOVED_ENGINE_KEYS`) are still read into their sections, with a
deprecation warning; ``engine.tensorrt.calib`` is accepted, with a warning, and
unused (INT8 engines build from the model ``detstream quantize`` makes).
:mod:`app.config` assembles the whole file from this section and the others and
re-exports these names.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from app.config_loading import StrictModel

logger = logging.getLogger(__name__)


class TensorRTConfig(StrictModel):
    """TensorRT: used when `engine.backend` is `auto` or `tensorrt` and TensorRT is usable here."""

    contexts: int = Field(2, ge=1, le=16, description="execution contexts, each on its own CUDA stream: batches in "
                          "flight on the GPU at once, so that copies of one overlap compute of another")
    cuda_graphs: bool = Field(True, description="capture a CUDA graph per batch size and replay it (fewer launches)")
    cache_dir: str | None = Field(None, description="engine cache (also ONNX Runtime's TensorRT EP cache); default "
                                  "~/.cache/detstream/engines")
    calib: str | None = Field(None, description="not used: INT8 runs the Q/DQ model that `detstream quantize --calib` "
                              "makes; accepted, with a warning, so that older files still load")

    @field_validator("calib")
    @classmethod
    def _calib_unused(cls, calib: str | None) -> str | None:
        if calib is not None:
            logger.warning("engine.tensorrt.calib is not used: INT8 engines are built from the Q/DQ model that "
                           "`detstream quantize --calib PATH` makes")
        return calib

    @property
    def engine_cache_dir(self) -> Path:
        """``cache_dir`` with ``~`` expanded, or the default ``~/.cache/detstream/engines``."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "detstream" / "engines"


class OnnxRuntimeConfig(StrictModel):
    """ONNX Runtime: `engine.backend: onnxruntime`, and the fallback when TensorRT is not usable."""

    workers: int = Field(2, ge=1, le=16, description="CPU provider: inference worker threads, each running single "
                         "frames on one shared session at the same time")
    intra_op_threads: int | None = Field(None, ge=1, le=256, description="intra-op threads per run; default physical "
                                         "cores // workers on the CPU provider, all physical cores on a GPU one")


class OpenVinoConfig(StrictModel):
    """OpenVINO: the CPU engine `engine.backend: auto` picks on a machine without an NVIDIA GPU."""

    requests: int = Field(2, ge=1, le=16, description="infer requests in flight, one per worker thread, each "
                          "running single frames on its own CPU stream (as ONNX Runtime's CPU workers do)")
    threads: int | None = Field(None, ge=1, le=256, description="CPU threads OpenVINO uses in all; default all "
                                "physical cores, shared out over the requests")
    device: str = Field("CPU", description="the OpenVINO device (`CPU`; `GPU`/`NPU` for Intel devices it lists)")


MOVED_ENGINE_KEYS: dict[str, tuple[str, ...]] = {
    "contexts": ("tensorrt.contexts", "onnxruntime.workers"),
    "cuda_graphs": ("tensorrt.cuda_graphs",),
    "cache_dir": ("tensorrt.cache_dir",),
    "calib": ("tensorrt.calib",),
    "intra_op_threads": ("onnxruntime.intra_op_threads",),
}
"""Flat ``engine.*`` keys of the previous release and the section keys they now set (accepted with a warning)."""


class EngineConfig(StrictModel):
    """The inference stage: backend choice, batching, and each backend's own settings in its own section.

    The sections are fields side by side rather than a union chosen by ``backend``: ``auto`` and
    ``tensorrt`` use both (ONNX Runtime is the fallback), and ``--engine`` may switch the backend of a
    file that configures either section.
    """

    backend: Literal["auto", "tensorrt", "onnxruntime", "openvino"] = Field(
        "auto", description="`auto`: TensorRT on an NVIDIA GPU, else ONNX Runtime's CUDA provider there, else "
        "OpenVINO on the CPU, else ONNX Runtime's CPU provider (one log line says which and why; "
        "`detstream doctor` shows the same decision)")
    max_batch: int = Field(8, ge=1, le=256)
    max_wait_ms: float = Field(10.0, ge=0, description="batching window: how long a batch waits for more frames "
                               "after its oldest; unused by ONNX Runtime's CPU workers, which run every frame alone")
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] = Field(
        "auto", description="`auto`: fp16 on a GPU, bf16 on a CPU that computes it natively (AVX512_BF16 or AMX), "
        "fp32 elsewhere; other values force it where the engine can (ONNX Runtime's CPU provider runs bf16 and "
        "fp16 as fp32, and says so); `int8` runs the model `detstream quantize` makes")
    ring_slots: int | None = Field(None, ge=2, le=4096,
                                   description="preallocated frame buffers; default from batch and sources")
    max_sources: int | None = Field(None, ge=1, le=1024, description="sources a run may hold, those added at "
                                    "runtime included (the ring is sized for them); default: the configured ones, plus "
                                    "4 with `http.enabled`")
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig, description="TensorRT settings; the flat "
                                     "`engine.contexts`, `cuda_graphs`, `cache_dir`, `calib` of the previous release "
                                     "are still read into it, with a warning")
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig, description="ONNX Runtime settings; "
                                           "the flat `engine.contexts` (as `workers`) and `intra_op_threads` of the "
                                           "previous release are still read into it, with a warning")

    openvino: OpenVinoConfig = Field(default_factory=OpenVinoConfig, description="OpenVINO settings")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Map the flat keys of :data:`MOVED_ENGINE_KEYS` onto their sections, warning once per key."""
        if not isinstance(data, dict) or not MOVED_ENGINE_KEYS.keys() & data.keys():
            return data
        data = dict(data)
        for old in [key for key in MOVED_ENGINE_KEYS if key in data]:
            targets = MOVED_ENGINE_KEYS[old]
            message = f"engine.{old} is deprecated: use " + " and ".join(f"engine.{t}" for t in targets)
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            logger.warning("%s", message)
            value = data.pop(old)
            for target in targets:
                section, _, name = target.partition(".")
                fields = data.get(section) or {}
                if not isinstance(fields, dict):
                    continue  # a malformed section is reported by its own validation
                if name in fields:
                    raise ValueError(f"engine.{old}: also set as engine.{target}; keep only engine.{target}")
                data[section] = {**fields, name: value}
        return data

    @property
    def in_flight(self) -> int:
        """Submitted batches that may wait for the postprocess thread: one per TensorRT context, ONNX Runtime
        worker or OpenVINO request, whichever backend runs, and at least two."""
        return max(2, self.tensorrt.contexts, self.onnxruntime.workers, self.openvino.requests)
