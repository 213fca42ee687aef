"""``AdaptiveLimit``: how many requests may be in flight, adapted by AIMD.

Every success adds ``1 / limit`` (so one more slot per round of ``limit`` requests); a
throttling answer (503 SlowDown) halves the limit, at most once per ``cooldown`` seconds so
that one burst of rejections counts as one signal.
"""

from __future__ import annotations

import threading
import time

__all__ = ["AdaptiveLimit"]


class AdaptiveLimit:
    """A semaphore whose size moves between ``minimum`` and ``maximum``."""

    def __init__(
        self, maximum: int, *, minimum: int = 1, decrease: float = 0.5, cooldown: float = 0.2
    ) -> None:
        if maximum < 1 or not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {decrease}")
        self.maximum = maximum
        self.minimum = minimum
        self.decrease = decrease
        self.cooldown = cooldown
        self._limit = float(maximum)
        self._in_flight = 0
        self._last_decrease = -1e9
        self.throttle_events = 0
        self.decreases = 0
        self.lowest = maximum
        self._cond = threading.Condition()

    @property
    def limit(self) -> int:
        return max(self.minimum, int(self._limit))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def acquire(self) -> None:
        with self._cond:
            while self._in_flight >= self.limit:
                self._cond.wait()
            self._in_flight += 1

    def release(self, *, throttled: bool = False) -> None:
        with self._cond:
            self._in_flight -= 1
            self._record(throttled)
            self._cond.notify_all()

    def cancel(self) -> None:
        """Give back a slot that sent no request: no signal for the limit."""
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def record_throttle(self) -> None:
        """A throttling answer to a request that did not hold a slot."""
        with self._cond:
            self._record(True)

    def _record(self, throttled: bool) -> None:
        """Additive increase on success, multiplicative decrease on throttling (held lock)."""
        if not throttled:
            self._limit = min(float(self.maximum), self._limit + 1.0 / self.limit)
            return
        self.throttle_events += 1
        now = time.monotonic()
        if now - self._last_decrease >= self.cooldown:
            self._last_decrease = now
            self._limit = max(float(self.minimum), self._limit * self.decrease)
            self.decreases += 1
            self.lowest = min(self.lowest, self.limit)
