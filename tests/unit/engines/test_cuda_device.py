"""CudaDevice's calls into cuda.bindings.runtime, on a recording stand-in built from the real module's constants.

The real ``cuda-bindings`` package (a dev dependency) imports without a GPU, so its enums and flag values are
real here; only the calls are recorded instead of reaching a driver. tests/conformance checks the call names
and parameters against the real module.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from app.engines.cuda.device import CudaDevice, import_cudart, native_handle
from app.errors import EngineLoadError

rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is a dev dependency")
SUCCESS = rt.cudaError_t.cudaSuccess


def _runtime(last_error: object = SUCCESS) -> tuple[ModuleType, list[tuple]]:
    calls: list[tuple] = []

    def record(name: str, *result: object):
        def call(*args: object) -> tuple:
            calls.append((name, *args))
            return (SUCCESS, *result)
        return call

    stub = SimpleNamespace(
        cudaError_t=rt.cudaError_t, cudaEventDisableTiming=rt.cudaEventDisableTiming,
        cudaEventBlockingSync=rt.cudaEventBlockingSync, cudaStreamNonBlocking=rt.cudaStreamNonBlocking,
        cudaSetDevice=record("cudaSetDevice"),
        cudaGetDeviceProperties=record("cudaGetDeviceProperties", SimpleNamespace(name=b"Fake GPU", major=9, minor=0)),
        cudaEventCreateWithFlags=record("cudaEventCreateWithFlags", rt.cudaEvent_t(7)),
        cudaGetLastError=lambda: (calls.append(("cudaGetLastError",)), (last_error,))[1],
        cudaGetErrorName=lambda err: (SUCCESS, err.name.encode()),
        cudaGetErrorString=lambda err: (SUCCESS, b"text"),
    )
    return stub, calls  # type: ignore[return-value]


def test_events_sleep_in_synchronize_instead_of_spinning_a_core() -> None:
    stub, calls = _runtime()
    CudaDevice(stub).event_create()
    (flags,) = [c[1] for c in calls if c[0] == "cudaEventCreateWithFlags"]
    assert flags & rt.cudaEventBlockingSync and flags & rt.cudaEventDisableTiming


def test_clear_last_error_reads_and_names_the_leftover_error() -> None:
    stub, calls = _runtime(rt.cudaError_t.cudaErrorStreamCaptureInvalidated)
    assert CudaDevice(stub).clear_last_error().startswith("cudaErrorStreamCaptureInvalidated")
    assert ("cudaGetLastError",) in calls
    stub, _ = _runtime()
    assert CudaDevice(stub).clear_last_error() is None


def test_native_handles_come_without_the_deprecated_int_conversion() -> None:
    assert native_handle(rt.cudaStream_t(0x1234)) == 0x1234
    assert native_handle(rt.cudaGraph_t(0)) == 0


@pytest.mark.parametrize(("version", "ok"), [("12.6.0", False), ("12.9.0", False), ("12.9.1", True), ("13.0.2", True)])
def test_cuda_bindings_older_than_12_9_1_are_refused_with_what_to_install(
        monkeypatch: pytest.MonkeyPatch, version: str, ok: bool) -> None:
    import cuda.bindings

    monkeypatch.setattr(cuda.bindings, "__version__", version)
    if ok:
        assert import_cudart() is sys.modules["cuda.bindings.runtime"]
    else:
        with pytest.raises(EngineLoadError, match=r"too old: pip install 'cuda-bindings>=12\.9\.1'"):
            import_cudart()
