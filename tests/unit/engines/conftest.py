"""The engine unit tests check the CPU provider's behaviour (worker threads, rectangles, batch sizes).

Where onnxruntime-gpu finds a GPU, the default provider order (TensorRT EP →
CUDA EP → CPU EP) would put these tests on the CUDA provider, which runs
differently by design (one padded shape per run); tests/gpu checks that one.
So here the default order is the CPU provider alone, on every machine. Seen
on the lent H100: without this, 51 of these tests failed there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _cpu_provider_only() -> Iterator[None]:
    # module scope: the modules' own module-scoped engines are made after it (autouse goes first), and the
    # patch ends with each module instead of leaking into later directories
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("app.engines.onnxruntime.DEFAULT_PROVIDERS", ("CPUExecutionProvider",))
        yield
