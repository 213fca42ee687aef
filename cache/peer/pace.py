"""What a ``PeerServer`` response may send: the ``Range`` it asks for, and the pace of all
responses together (``rate``, bytes per second)."""

from __future__ import annotations

import re
import threading
import time

__all__ = ["Throttle", "parse_range"]


class Throttle:
    """Bytes per second over all responses (0: unbounded)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def take(self, n: int) -> None:
        """Wait until ``n`` more bytes fit in the rate (their own time included)."""
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next, now) + n / self.rate
            wait = self._next - now
        time.sleep(wait)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` as ``[a, b + 1)`` within ``size``; no header: the whole shard."""
    if header is None:
        return 0, size
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", header.strip())
    if m is None:
        return None
    lo, hi = int(m.group(1)), int(m.group(2)) + 1
    if lo >= hi or hi > size:
        return None
    return lo, hi
