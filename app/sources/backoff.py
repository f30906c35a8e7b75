"""Reconnect delays: exponential with full jitter, capped, reset after a stable period.

The n-th consecutive retry (n from 0) waits ``uniform(0, min(max_s, initial_s * multiplier**n))``
("full jitter": many cameras behind one dead switch do not reconnect in lock
step). Once a connection has been running for ``reset_after_s``, the next
failure starts again from ``initial_s``.

>>> b = Backoff(initial_s=0.5, max_s=30.0, rng=lambda low, high: high)  # no jitter
>>> [b.next_delay() for _ in range(8)]
[0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from app.config import BackoffConfig

Uniform = Callable[[float, float], float]
Clock = Callable[[], float]


class Backoff:
    """Delay before each reconnect attempt of one source; owned by its decoder thread."""

    def __init__(
        self,
        initial_s: float = 0.5,
        max_s: float = 30.0,
        multiplier: float = 2.0,
        reset_after_s: float = 30.0,
        *,
        rng: Uniform | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.reset_after_s = reset_after_s
        self._uniform = rng or random.Random().uniform
        self._clock = clock
        self._failures = 0
        self._running_since: float | None = None

    @classmethod
    def from_config(
        cls, config: BackoffConfig, *, rng: Uniform | None = None, clock: Clock = time.monotonic
    ) -> Backoff:
        return cls(config.initial_s, config.max_s, config.multiplier, config.reset_after_s, rng=rng, clock=clock)

    @property
    def attempt(self) -> int:
        """Consecutive failed attempts so far (1 after the first failure)."""
        return self._failures

    def cap_s(self, failures: int) -> float:
        """The largest delay after ``failures`` previous consecutive failures."""
        return min(self.max_s, self.initial_s * self.multiplier ** min(failures, 64))

    def running(self) -> None:
        """The source delivered its first frame: start the stable-period clock."""
        self._running_since = self._clock()

    def next_delay(self) -> float:
        """The wait before the next attempt; counts one more failure."""
        if self._running_since is not None and self._clock() - self._running_since >= self.reset_after_s:
            self._failures = 0
        self._running_since = None
        delay = self._uniform(0.0, self.cap_s(self._failures))
        self._failures += 1
        return delay
