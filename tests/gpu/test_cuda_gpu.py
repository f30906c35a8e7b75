"""The CUDA calls under the TensorRT path, on a real GPU: pinned memory, streams, events, graph capture.

These need cuda-python and a GPU, not TensorRT, so they run on a GPU machine
without TensorRT too. They check what the host fake (``HostDevice``) stands
in for in the CPU tests: that :class:`CudaDevice` really moves bytes, that its
events really wait, and that a captured graph replays with the host data of
the moment it is launched (the engine relies on this: it captures once per
batch size and refills the same pinned input rows every batch).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engines.cuda.device import CudaDevice
from app.engines.cuda.host_memory import PinnedAllocator, alloc_host
from app.errors import EngineError
from app.ring import FrameRing

pytestmark = pytest.mark.gpu

NBYTES = 1 << 20


@pytest.fixture
def device() -> CudaDevice:
    gpu = CudaDevice.open()
    yield gpu
    gpu.close()


def test_pinned_host_buffers_come_from_cuda_when_a_gpu_is_present() -> None:
    buffer = alloc_host((2, 3, 8, 8), np.float32)
    try:
        assert buffer.pinned
        assert buffer.ptr % 64 == 0
        buffer.array[:] = 1.5
        assert float(buffer.array.sum()) == 1.5 * buffer.array.size
    finally:
        buffer.free()


def test_the_frame_ring_is_page_locked_through_the_pinned_allocator() -> None:
    allocator = PinnedAllocator()
    ring = FrameRing(4, 32, 48, allocator=allocator)
    assert allocator.pinned
    assert ring.buffer.shape == (4, 3, 32, 48)
    ring.buffer[:] = 0.25
    assert float(ring.buffer.mean()) == 0.25
    for buffer in allocator.buffers:
        buffer.free()


def test_the_device_names_itself_for_the_engine_cache_key(device: CudaDevice) -> None:
    assert device.device_name().startswith("NVIDIA")
    major, minor = device.compute_capability()
    assert major >= 5 and minor >= 0


def test_bytes_round_trip_through_device_memory_on_a_non_blocking_stream(device: CudaDevice) -> None:
    src, dst = alloc_host(NBYTES, np.uint8, device=device), alloc_host(NBYTES, np.uint8, device=device)
    stream, event = device.stream_create(), device.event_create()
    d_ptr = device.malloc(NBYTES)
    try:
        src.array[:] = np.arange(NBYTES, dtype=np.uint32).astype(np.uint8)
        dst.array[:] = 0
        device.memcpy_htod_async(d_ptr, src.ptr, NBYTES, stream)
        device.memcpy_dtoh_async(dst.ptr, d_ptr, NBYTES, stream)
        device.event_record(event, stream)
        device.event_synchronize(event)
        assert device.event_query(event)
        np.testing.assert_array_equal(dst.array, src.array)
    finally:
        device.free(d_ptr)
        device.event_destroy(event)
        device.stream_destroy(stream)
        src.free()
        dst.free()


def test_a_captured_graph_replays_with_the_host_data_of_each_launch(device: CudaDevice) -> None:
    src, dst = alloc_host(NBYTES, np.uint8, device=device), alloc_host(NBYTES, np.uint8, device=device)
    stream, event = device.stream_create(), device.event_create()
    d_ptr = device.malloc(NBYTES)
    graph = graph_exec = None
    try:
        device.stream_begin_capture(stream)
        device.memcpy_htod_async(d_ptr, src.ptr, NBYTES, stream)
        device.memcpy_dtoh_async(dst.ptr, d_ptr, NBYTES, stream)
        graph = device.stream_end_capture(stream)
        graph_exec = device.graph_instantiate(graph)
        dst.array[:] = 0
        device.event_record(event, stream)
        device.event_synchronize(event)
        assert not dst.array.any(), "capturing ran the copies instead of recording them"
        for value in (7, 200, 3):
            src.array[:] = value
            device.graph_launch(graph_exec, stream)
            device.event_record(event, stream)
            device.event_synchronize(event)
            assert (dst.array == value).all()
    finally:
        if graph_exec is not None:
            device.graph_exec_destroy(graph_exec)
        if graph is not None:
            device.graph_destroy(graph)
        device.free(d_ptr)
        device.event_destroy(event)
        device.stream_destroy(stream)
        src.free()
        dst.free()


def test_a_cuda_failure_names_the_call_and_cuda_s_error(device: CudaDevice) -> None:
    with pytest.raises(EngineError, match=r"cudaMalloc failed: cudaErrorMemoryAllocation"):
        device.malloc(1 << 60)
    ptr = device.malloc(256)  # the failure did not poison the context
    device.free(ptr)
