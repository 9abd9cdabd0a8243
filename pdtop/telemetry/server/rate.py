"""A token bucket: at most `rate` actions a second on average, bursts up to `burst`."""
from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._last = burst, clock()

    def take(self) -> bool:
        """Spend one token if there is one."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
