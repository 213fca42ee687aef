"""A weighted fair queue: items queue per flow (a tenant, or a tenant's job), and ``get``
takes from the flow that has had the least service for its weight (stride scheduling).

A flow that floods the queue gets its share and no more: every other flow with work waiting
is served at least once per round, whatever the flood's length. Inside a flow, ``urgent``
items (a read waiting now) go before the others (fetches ahead), each kind in its order.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import Any

__all__ = ["FairQueue"]


class FairQueue:
    """``put(flow, item, weight=)``; ``get()`` blocks until an item is there (None once
    closed and empty)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._flows: dict[Hashable, tuple[deque[Any], deque[Any]]] = {}  # (urgent, others)
        self._passes: dict[Hashable, float] = {}
        self._weights: dict[Hashable, float] = {}
        self._clock = 0.0
        self._closed = False

    def put(self, flow: Hashable, item: Any, *, weight: float = 1.0, urgent: bool = False) -> None:
        if weight <= 0:
            raise ValueError(f"weight must be > 0, got {weight!r}")
        with self._cond:
            qs = self._flows.get(flow)
            if qs is None:
                qs = self._flows[flow] = (deque(), deque())
                # a flow that was idle starts at the clock: no credit saved up while idle
                self._passes[flow] = max(self._passes.get(flow, 0.0), self._clock)
            self._weights[flow] = weight
            qs[0 if urgent else 1].append(item)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> Any:
        with self._cond:
            while not self._flows:
                if self._closed:
                    return None
                if not self._cond.wait(timeout):
                    return None
            flow = min(self._flows, key=lambda f: self._passes[f])
            urgent, others = self._flows[flow]
            item = (urgent or others).popleft()
            self._clock = self._passes[flow]
            self._passes[flow] += 1.0 / self._weights[flow]
            if not urgent and not others:
                del self._flows[flow]
            return item

    def refund(self, flow: Hashable) -> None:
        """Give back the turn ``get`` charged ``flow`` for an item that needed no service
        (a fetch ahead of a shard that arrived meanwhile): its next items are not delayed
        for it."""
        with self._cond:
            if flow in self._passes:
                self._passes[flow] -= 1.0 / self._weights[flow]

    def waiting(self, flow: Hashable) -> int:
        with self._cond:
            qs = self._flows.get(flow)
            return 0 if qs is None else len(qs[0]) + len(qs[1])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
