"""HostDevice behaves like CUDA where the scheduler can tell: ordering, events, sticky errors, graphs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from host_device import HostDevice

from app.engines.cuda.host_memory import PinnedAllocator, alloc_host
from app.errors import EngineError, StateError


def test_copies_round_trip_through_device_memory_at_offsets(device: HostDevice) -> None:
    src = alloc_host((4, 16), np.float32, device=device)
    dst = alloc_host((4, 16), np.float32, device=device)
    src.array[:] = np.arange(64, dtype=np.float32).reshape(4, 16)
    ptr = device.malloc(src.nbytes)
    stream, event = device.stream_create(), device.event_create()
    row = 16 * 4
    for i in (3, 2, 1, 0):  # row by row, in reverse, like per-frame H2D
        device.memcpy_htod_async(ptr + i * row, src.ptr + i * row, row, stream)
    device.memcpy_dtoh_async(dst.ptr, ptr, src.nbytes, stream)
    device.event_record(event, stream)
    device.event_synchronize(event)
    np.testing.assert_array_equal(dst.array, src.array)
    assert src.pinned and dst.pinned


def test_an_event_completes_only_when_its_stream_reaches_it(device: HostDevice) -> None:
    stream, event = device.stream_create(), device.event_create()
    gate = threading.Event()
    device.enqueue(stream, lambda: gate.wait(5))
    device.event_record(event, stream)
    assert not device.event_query(event)
    gate.set()
    device.event_synchronize(event)
    assert device.event_query(event)


def test_two_streams_run_concurrently(device: HostDevice) -> None:
    """Each stream's operation waits for the other's to start: serialised streams would break the barrier."""
    streams = [device.stream_create() for _ in range(2)]
    events = [device.event_create() for _ in range(2)]
    both_running = threading.Barrier(2, timeout=5.0)
    met = []
    for stream, event in zip(streams, events, strict=True):
        device.enqueue(stream, lambda: met.append(both_running.wait()))
        device.event_record(event, stream)
    for event in events:
        device.event_synchronize(event)  # raises EngineError if a barrier wait failed
    assert sorted(met) == [0, 1]


def test_a_failed_operation_poisons_its_stream_and_the_next_sync_raises(device: HostDevice) -> None:
    stream, event = device.stream_create(), device.event_create()
    ran = []

    def boom() -> None:
        raise RuntimeError("illegal address")

    device.enqueue(stream, boom)
    device.enqueue(stream, lambda: ran.append(1))
    device.event_record(event, stream)
    with pytest.raises(EngineError, match="illegal address"):
        device.event_synchronize(event)
    assert ran == []


def test_a_captured_graph_replays_the_recorded_operations(device: HostDevice) -> None:
    stream, event = device.stream_create(), device.event_create()
    counter = []
    device.stream_begin_capture(stream)
    device.enqueue(stream, lambda: counter.append("k"))
    graph = device.stream_end_capture(stream)
    assert counter == []  # captured, not run
    exec_ = device.graph_instantiate(graph)
    for _ in range(3):
        device.graph_launch(exec_, stream)
    device.event_record(event, stream)
    device.event_synchronize(event)
    assert counter == ["k", "k", "k"]


@pytest.mark.parametrize("kind", ["malloc", "host_alloc", "stream_create", "capture", "device_query"])
def test_fault_injection_fails_the_nth_and_later_calls(kind: str) -> None:
    dev = HostDevice(fail_on={kind: 2})
    calls = {
        "malloc": lambda: dev.malloc(16),
        "host_alloc": lambda: dev.host_alloc(16),
        "stream_create": dev.stream_create,
        "capture": lambda: (dev.stream_begin_capture(s := dev.stream_create()), dev.stream_end_capture(s)),
        "device_query": dev.device_name,
    }
    try:
        calls[kind]()
        for _ in range(2):
            with pytest.raises(EngineError, match=f"injected {kind} failure"):
                calls[kind]()
    finally:
        dev.close()


def test_an_out_of_range_device_pointer_is_refused(device: HostDevice) -> None:
    ptr = device.malloc(64)
    with pytest.raises(EngineError, match="invalid device range"):
        device.view(ptr + 32, 64)


def test_host_buffers_without_a_device_are_aligned_and_freed_once() -> None:
    buffer = alloc_host((3, 5, 7), np.float32)
    assert buffer.array.shape == (3, 5, 7) and buffer.array.dtype == np.float32
    assert buffer.ptr % 64 == 0
    assert buffer.array.flags.c_contiguous and buffer.array.flags.writeable
    buffer.free()
    buffer.free()
    with pytest.raises(StateError):
        _ = buffer.array


def test_pinned_host_buffers_are_released_to_the_device_on_free(device: HostDevice) -> None:
    buffer = alloc_host((2, 3), np.uint8, device=device)
    assert buffer.pinned and len(device._host_blocks) == 1
    buffer.array[:] = 7
    buffer.free()
    assert device._host_blocks == {}


def test_the_ring_allocator_says_whether_its_buffers_are_page_locked(device: HostDevice, monkeypatch) -> None:
    from app.engines.cuda import host_memory

    pinned = PinnedAllocator(device)
    assert not pinned.pinned  # nothing allocated yet: nothing to vouch for
    slots = pinned((4, 3, 8, 8))
    assert slots.shape == (4, 3, 8, 8) and slots.dtype == np.float32 and pinned.pinned
    monkeypatch.setattr(host_memory, "_default_cuda_device", lambda: None)  # no CUDA: pageable fallback
    pageable = PinnedAllocator()
    pageable((2, 3, 8, 8))
    assert not pageable.pinned and pageable.buffers[0].array.shape == (2, 3, 8, 8)
