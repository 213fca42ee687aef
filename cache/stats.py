"""Cache counters: kept per process, merged into ``<root>/stats.json`` for ``cache status``.

The file is rewritten atomically under a lock, so concurrent processes add up correctly and a
crash leaves either the old or the new counts.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from flashfeed.runtime.files import atomic_write_json

from .layout import make_private_dir, read_json
from .locks import locked

__all__ = ["COUNTERS", "Counters", "read_persisted"]

COUNTERS = (
    "hits",
    "misses",
    "shared_waits",
    "bytes_fetched",
    "fetch_seconds",
    "requests",
    "retries",
    "throttle_events",
    "evictions",
    "evicted_bytes",
    "corrupt_refetches",
    "failures",
    "fetch_ahead_skipped",
    "over_capacity",
)


def _stats_path(root: str) -> str:
    return os.path.join(root, "stats.json")


def read_persisted(root: str) -> dict[str, Any]:
    """The node-wide counters as last flushed by every process that used ``root``."""
    data = read_json(_stats_path(root), {}) or {}
    out: dict[str, Any] = {k: data.get(k, 0) for k in (*COUNTERS, "updated")}
    out["gauges"] = data.get("gauges", {})
    return out


class Counters:
    """Thread-safe counters with a running total and an unflushed delta."""

    def __init__(self, root: str, *, flush_every: float = 2.0) -> None:
        self.root = root
        self.flush_every = flush_every
        self._total: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._delta: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._gauges: dict[str, float] = {}
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()

    def add(self, **values: float) -> None:
        with self._lock:
            for k, v in values.items():
                self._total[k] += v
                self._delta[k] += v
        if time.monotonic() - self._last_flush >= self.flush_every:
            self.flush()

    def set_gauges(self, **values: float) -> None:
        """Values persisted as they are (not added up), e.g. the current concurrency."""
        with self._lock:
            self._gauges.update(values)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._total)

    def flush(self) -> None:
        """Add the unflushed delta to ``stats.json``."""
        with self._lock:
            delta, self._delta = self._delta, dict.fromkeys(COUNTERS, 0)
            gauges = dict(self._gauges)
            self._last_flush = time.monotonic()
        if not any(delta.values()) and not gauges:
            return
        locks = make_private_dir(os.path.join(self.root, ".locks"))
        try:
            with locked(os.path.join(locks, "stats.lock")):
                data = read_json(_stats_path(self.root), {}) or {}
                for k, v in delta.items():
                    data[k] = data.get(k, 0) + v
                data.setdefault("gauges", {}).update(gauges)
                data["updated"] = time.time()
                atomic_write_json(_stats_path(self.root), data)
        except OSError:
            with self._lock:  # keep the counts for the next flush (disk full, say)
                for k, v in delta.items():
                    self._delta[k] += v
