"""Each tenant's request rate at the node service: a token bucket per tenant, taken by the
thread that reads the tenant's socket before it queues a request. A tenant over its rate
waits there, its further requests unread in its own socket: it costs the service (and, as
its sends block, itself) no CPU, which the other tenants' requests then have."""

from __future__ import annotations

import threading
import time

__all__ = ["RequestPace"]


class RequestPace:
    """Token buckets by tenant; ``take(tenant, rate)`` waits for one request's turn (a
    second's worth of requests may come at once; ``rate`` 0: no wait)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def take(self, tenant: str, rate: float) -> float:
        """Wait until ``tenant`` may send one more request; the seconds waited."""
        if rate <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            tokens, at = self._buckets.get(tenant, (rate, now))
            tokens = min(rate, tokens + (now - at) * rate) - 1.0
            self._buckets[tenant] = (tokens, now)
        wait = -tokens / rate if tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)
        return wait
