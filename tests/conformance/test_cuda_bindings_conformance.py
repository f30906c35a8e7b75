"""Every ``cuda.bindings.runtime`` name CudaDevice uses exists in the real cuda-bindings, called with a fitting arity.

The real package (a dev dependency, ``cuda-bindings>=12.9.1``) imports without a GPU; its functions carry
real signatures (``inspect.signature``), its enums real members.
"""

from __future__ import annotations

import inspect

import pytest
from api_usage import CUDA_SOURCES, CUDA_VARIABLES, MODULE, uses

rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings is a dev dependency (pip install -e '.[dev]')")


def test_every_runtime_name_the_device_uses_exists_with_a_fitting_signature() -> None:
    found = uses(CUDA_SOURCES, CUDA_VARIABLES)
    assert {u.member for u in found} >= {"cudaEventBlockingSync", "cudaGetLastError", "cudaStreamBeginCapture"}
    problems = []
    for use in found:
        owner = rt if use.owner == MODULE else getattr(rt, use.owner, None)
        if owner is None or not hasattr(owner, use.member):
            problems.append(f"{use.where}: no cuda.bindings.runtime.{use.owner}.{use.member}".replace(f"{MODULE}.", ""))
            continue
        if use.call:
            try:
                inspect.signature(getattr(owner, use.member)).bind(*range(use.positional),
                                                                    **dict.fromkeys(use.keywords))
            except TypeError as error:
                problems.append(f"{use.where}: {use.member}: {error}")
    assert not problems, "\n".join(problems)


def test_the_native_handle_accessor_exists_in_this_cuda_bindings() -> None:
    from cuda.bindings.utils import get_cuda_native_handle

    assert get_cuda_native_handle(rt.cudaStream_t(42)) == 42
