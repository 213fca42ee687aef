"""Fetches ahead of need: background fills, at most one queued per shard at a time.

A failure is logged and kept (``errors``) rather than raised: the fetch was a hint, and the
``get`` that needs the shard later tries again and raises if it must.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["FetchAhead"]

log = logging.getLogger("flashfeed.cache")


class FetchAhead:
    """A small pool running ``fetch()`` calls keyed by shard, each key queued once."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ff-ahead")
        self._lock = threading.Lock()
        self._pending: dict[Hashable, Future[str]] = {}
        self.errors: dict[Hashable, BaseException] = {}

    def submit(self, key: Hashable, fetch: Callable[[], str], what: str) -> None:
        """Queue ``fetch`` unless one for ``key`` is queued or running; ``what`` names the
        shard in the warning a failure logs."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None and not pending.done():
                return
            self._pending[key] = self._pool.submit(self._one, key, fetch, what)

    def _one(self, key: Hashable, fetch: Callable[[], str], what: str) -> str:
        try:
            path = fetch()
            self.errors.pop(key, None)
            return path
        except BaseException as exc:
            self.errors[key] = exc
            log.warning("fetch ahead of %s failed: %s", what, exc)
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the fetches queued so far have finished (or failed)."""
        with self._lock:
            pending = list(self._pending.values())
        wait(pending, timeout=timeout)

    def close(self) -> None:
        """Finish what is queued, then stop the threads."""
        self._pool.shutdown(wait=True)
