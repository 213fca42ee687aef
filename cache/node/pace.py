"""Each tenant's request rate at the node service: a token bucket per tenant, which the
request loop asks before it serves the tenant's next request. A tenant over its rate is not
served (nor read) until it has a token again: its further requests wait unread in its own
socket, costing the service nothing, and the other tenants' requests have the loop."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RequestPace"]


class RequestPace:
    """Token buckets by tenant at ``rate(tenant)`` requests a second (0: unbounded); a
    second's worth of requests may come at once. Used by one thread (the request loop)."""

    def __init__(self, rate: Callable[[str], float]) -> None:
        self.rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def _tokens(self, tenant: str) -> tuple[float, float]:
        rate = self.rate(tenant)
        now = time.monotonic()
        tokens, at = self._buckets.get(tenant, (rate, now))
        return min(rate, tokens + (now - at) * rate), rate

    def wait(self, tenant: str) -> float:
        """Seconds until ``tenant`` may be served once more (0: now)."""
        tokens, rate = self._tokens(tenant)
        return 0.0 if rate <= 0 or tokens >= 1.0 else (1.0 - tokens) / rate

    def take(self, tenant: str) -> bool:
        """Serve one request of ``tenant`` now if its rate allows (True), else False."""
        tokens, rate = self._tokens(tenant)
        if rate <= 0:
            return True
        if tokens < 1.0:
            return False
        self._buckets[tenant] = (tokens - 1.0, time.monotonic())
        return True
