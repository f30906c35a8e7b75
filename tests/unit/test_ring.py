"""FrameRing: explicit slot states, one owner at a time, nothing allocated per frame."""

import threading

import numpy as np
import pytest

from app.errors import StateError
from app.ring import FrameRing, SlotState, aligned_empty
from app.types import UINT8_HWC


def test_slots_are_views_into_one_aligned_preallocated_buffer():
    ring = FrameRing(4, 32, 48)
    assert ring.buffer.shape == (4, 3, 32, 48)
    assert ring.buffer.ctypes.data % 64 == 0
    for slot in ring.slots:
        assert slot.array.base is not None and np.shares_memory(slot.array, ring.buffer)


def test_a_slot_follows_free_filling_ready_in_flight_free():
    ring = FrameRing(1, 8, 8)
    slot = ring.try_acquire("cam")
    assert slot.state is SlotState.FILLING and slot.owner == "cam"
    assert ring.try_acquire("cam") is None
    ring.transition(slot, SlotState.READY)
    ring.transition(slot, SlotState.IN_FLIGHT)
    ring.transition(slot, SlotState.FREE)
    assert ring.free_count == 1 and slot.owner == ""


@pytest.mark.parametrize(("path", "bad"), [
    ((), SlotState.IN_FLIGHT),
    ((SlotState.READY, SlotState.IN_FLIGHT), SlotState.READY),
    ((SlotState.READY, SlotState.IN_FLIGHT), SlotState.FILLING),
])
def test_illegal_transitions_raise_naming_the_states(path, bad):
    ring = FrameRing(1, 4, 4)
    slot = ring.try_acquire("cam")
    for state in path:
        ring.transition(slot, state)
    with pytest.raises(StateError, match=bad.name):
        ring.transition(slot, bad)


def test_concurrent_producers_never_share_a_slot():
    ring = FrameRing(6, 4, 4)
    owners: dict[int, str] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def producer(name: str) -> None:
        for _ in range(300):
            slot = ring.acquire(name, timeout_s=1.0)
            if slot is None:
                errors.append(f"{name}: no slot within 1 s")
                return
            with lock:
                if slot.index in owners:
                    errors.append(f"slot {slot.index} taken by {owners[slot.index]} and {name}")
                owners[slot.index] = name
            slot.array[:] = 1.0
            ring.transition(slot, SlotState.READY)
            with lock:
                del owners[slot.index]
            ring.transition(slot, SlotState.IN_FLIGHT)
            ring.transition(slot, SlotState.FREE)

    threads = [threading.Thread(target=producer, args=(f"p{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert ring.free_count == 6


def test_acquire_waits_for_a_release_and_times_out_otherwise():
    ring = FrameRing(1, 4, 4)
    slot = ring.try_acquire("a")
    assert ring.acquire("b", timeout_s=0.05) is None
    threading.Timer(0.05, ring.transition, (slot, SlotState.FREE)).start()
    assert ring.acquire("b", timeout_s=2.0) is not None


def test_aligned_empty_is_aligned_for_odd_shapes():
    for shape in [(1, 3, 5, 7), (2, 3, 13, 17)]:
        assert aligned_empty(shape).ctypes.data % 64 == 0


def test_a_freed_slot_is_the_next_one_handed_out_so_idle_slots_stay_untouched():
    ring = FrameRing(8, 4, 4)
    used = set()
    for _ in range(20):  # one frame in flight at a time, as a slow camera does
        slot = ring.try_acquire("cam")
        used.add(slot.index)
        ring.transition(slot, SlotState.FREE)
    assert len(used) == 1


def test_a_uint8_ring_holds_channels_last_pixels_and_views_rectangles_from_the_start():
    ring = FrameRing(2, 8, 12, frame_format=UINT8_HWC)
    assert ring.buffer.dtype == np.uint8 and ring.buffer.shape == (2, 8, 12, 3)
    slot = ring.try_acquire("cam")
    view = slot.shape_to(4, 8)
    assert view.shape == (4, 8, 3) and view.flags.c_contiguous and np.shares_memory(view, slot.buffer)
    with pytest.raises(ValueError, match="does not fit"):
        slot.shape_to(16, 8)


def test_an_allocator_of_the_wrong_dtype_is_refused():
    with pytest.raises(ValueError, match="float32 slots for uint8 frames"):
        FrameRing(2, 4, 4, aligned_empty, UINT8_HWC)
