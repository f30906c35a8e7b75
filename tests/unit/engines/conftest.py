"""The engine unit tests check the CPU provider's behaviour (worker threads, rectangles, batch sizes).

Where onnxruntime-gpu finds a GPU, the default provider order (TensorRT EP →
CUDA EP → CPU EP) would put these tests on the CUDA provider, which runs
differently by design (one padded shape per run); tests/gpu checks that one.
So here the default order is the CPU provider alone, on every machine.

The path GPU providers take (one synchronous, padded run per batch) is tested here too, through
``run_path``: its ``synchronous`` side gives the engine a CPU session that reports the CUDA provider
first, so that the engine takes that path while the arithmetic stays on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnxruntime
import pytest
from host_device import HostDevice


@pytest.fixture
def device() -> Iterator[HostDevice]:
    """A HostDevice (threads as CUDA streams), closed after the test."""
    dev = HostDevice()
    yield dev
    dev.close()


@pytest.fixture(scope="module", autouse=True)
def _cpu_provider_only() -> Iterator[None]:
    # module scope: the modules' own module-scoped engines are made after it (autouse goes first), and the
    # patch ends with each module instead of leaking into later directories
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("app.engines.onnxruntime.session.DEFAULT_PROVIDERS", ("CPUExecutionProvider",))
        yield


class SessionReportingCuda(onnxruntime.InferenceSession):
    """A CPU session that names the CUDA provider first, as a CUDA session does."""

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", *super().get_providers()]


@pytest.fixture
def gpu_provider_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines made in this test take the GPU providers' synchronous path (see the module docstring)."""
    monkeypatch.setattr(onnxruntime, "InferenceSession", SessionReportingCuda)


@pytest.fixture(params=["workers", "synchronous"])
def run_path(request: pytest.FixtureRequest) -> str:
    """Both ways OrtEngine runs: the CPU provider's worker threads and the GPU providers' synchronous runs."""
    if request.param == "synchronous":
        request.getfixturevalue("gpu_provider_path")
    return request.param
