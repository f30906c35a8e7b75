"""Host buffers for frames and engine outputs: page-locked when CUDA is usable, aligned numpy otherwise.

Why pinned: ``cudaMemcpyAsync`` from pageable memory is staged through a
driver buffer and is not truly asynchronous, so copies of batch k+1 could not
overlap compute of batch k. Why one type: the ring and the engines handle a
:class:`HostBuffer` the same way whether or not it is pinned; ``.pinned``
says which (and metrics/logs can report it).
"""

from __future__ import annotations

import ctypes
import logging
import math
import weakref
from collections.abc import Callable

import numpy as np
from numpy.typing import DTypeLike

from app.engines.cuda.device import CudaDevice, Device
from app.errors import EngineError, StateError

logger = logging.getLogger(__name__)

ALIGNMENT = 64


class HostBuffer:
    """One host allocation viewed as a numpy array.

    ``array`` has the requested shape and dtype and starts on a 64-byte
    boundary. ``pinned`` is True when the memory is page-locked (from
    ``Device.host_alloc``). ``free()`` releases it (idempotent); after that,
    ``array`` raises :class:`StateError` instead of returning dangling memory.
    Page-locked memory goes back to the device only once no numpy view of it
    is left: a consumer may still read the outputs of the last batch (views of
    an engine's output set) when the engine is closed, and freeing under it
    would be a use after free.
    """

    def __init__(self, array: np.ndarray, pinned: bool, release: Callable[[], None] | None = None) -> None:
        self._array: np.ndarray | None = array
        self.pinned = pinned
        self._release = release

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            raise StateError("HostBuffer: used after free()")
        return self._array

    @property
    def ptr(self) -> int:
        """Address of the first byte (for async copies)."""
        return int(self.array.ctypes.data)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def free(self) -> None:
        if self._array is None:
            return
        self._array = None
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def __repr__(self) -> str:
        state = "freed" if self._array is None else f"{self._array.shape} {self._array.dtype}"
        return f"HostBuffer({state}, pinned={self.pinned})"


def alloc_host(shape: int | tuple[int, ...], dtype: DTypeLike, *, device: Device | None = None) -> HostBuffer:
    """Allocate a host buffer, page-locked through ``device`` when given, else through CUDA if usable.

    Without a usable CUDA device (or when ``cudaHostAlloc`` fails, e.g. the
    pinned-memory limit is reached) the buffer is an ordinary 64-byte-aligned
    numpy array and ``pinned`` is False; a pinned allocation that fails when a
    device was passed explicitly raises :class:`EngineError`.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    nbytes = math.prod(dims) * dt.itemsize
    if device is None:
        device = _default_cuda_device()
        if device is None:
            return HostBuffer(_aligned_empty(nbytes).view(dt).reshape(dims), pinned=False)
        try:
            return _pinned(device, dims, dt, nbytes)
        except EngineError as error:
            logger.warning("pinned host allocation of %d bytes failed (%s); using pageable memory", nbytes, error)
            return HostBuffer(_aligned_empty(nbytes).view(dt).reshape(dims), pinned=False)
    return _pinned(device, dims, dt, nbytes)


class PinnedAllocator:
    """A ring allocator (``shape -> float32 array``) that page-locks through :func:`alloc_host`.

    It keeps the :class:`HostBuffer` objects, so that the caller can say whether
    the memory really is page-locked (``alloc_host`` falls back to pageable
    memory, with a warning, when CUDA refuses).
    """

    def __init__(self, device: Device | None = None) -> None:
        self.buffers: list[HostBuffer] = []
        self._device = device

    def __call__(self, shape: tuple[int, ...]) -> np.ndarray:
        self.buffers.append(alloc_host(shape, np.float32, device=self._device))
        return self.buffers[-1].array

    @property
    def pinned(self) -> bool:
        """Every buffer allocated so far is page-locked."""
        return bool(self.buffers) and all(buffer.pinned for buffer in self.buffers)


def _pinned(device: Device, dims: tuple[int, ...], dt: np.dtype, nbytes: int) -> HostBuffer:
    ptr = device.host_alloc(max(nbytes, 1))
    raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
    root = np.frombuffer(raw, np.uint8, count=nbytes)  # every view's .base: it lives as long as any view
    weakref.finalize(root, _host_free, device, ptr).atexit = False  # at exit the process releases it
    array = root.view(dt).reshape(dims)
    del root
    return HostBuffer(array, pinned=True)  # free() drops the last owned view; the finalizer releases


def _host_free(device: Device, ptr: int) -> None:
    """Runs when the last view of a pinned buffer is gone (see :class:`HostBuffer`)."""
    try:
        device.host_free(ptr)
    except EngineError as error:
        logger.warning("releasing pinned host memory %#x failed: %s", ptr, error)


def _aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uint8 starting on an :data:`ALIGNMENT` boundary (the base array stays referenced by the view)."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes]


def _default_cuda_device() -> CudaDevice | None:
    """A CUDA device when one is usable here, else None (the reason is logged at DEBUG)."""
    try:
        return CudaDevice.open()
    except EngineError as error:
        logger.debug("no pinned memory: %s", error)
        return None
