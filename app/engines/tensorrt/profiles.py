"""Batch sizes for the TensorRT path: optimization profiles at build time, buckets at run time.

Shared by the builder (which profiles an engine has) and the scheduler (which bucket a batch runs at),
so that both agree without either importing the other.
"""

from __future__ import annotations

from collections.abc import Sequence

WIDE_RATIO = 8
PROFILE_SPAN = 4


def plan_profiles(low: int, opt: int, high: int) -> tuple[tuple[int, int, int], ...]:
    """Optimization profiles for batch ``low:opt:high``; several when the range is wide.

    TensorRT tunes kernels for ``opt``; over a wide range (ratio > 8) a size far
    from ``opt`` runs poorly, so the range is split at powers of 4 (1–4, 5–16,
    17–64, …), each profile optimised for ``opt`` if it lies inside, else its top.
    """
    if not 1 <= low <= opt <= high:
        raise ValueError(f"batch profile needs 1 <= min <= opt <= max, got {low}:{opt}:{high}")
    if high <= low * WIDE_RATIO:
        return ((low, opt, high),)
    profiles = []
    start, edge = low, PROFILE_SPAN
    while start <= high:
        while edge < start:
            edge *= PROFILE_SPAN
        top = min(edge, high)
        profiles.append((start, opt if start <= opt <= top else top, top))
        start = top + 1
    return tuple(profiles)


def bucket_sizes(low: int, high: int) -> tuple[int, ...]:
    """Powers of two in ``[low, high]``, plus ``low`` and ``high`` themselves."""
    sizes = {low, high} | {1 << i for i in range(high.bit_length()) if low <= 1 << i <= high}
    return tuple(sorted(sizes))


def choose_bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` frames."""
    for size in buckets:
        if size >= n:
            return size
    raise ValueError(f"batch of {n} frames exceeds the largest bucket {buckets[-1]}")
