"""The node's copies of shards: a good one is used, a missing or corrupt one filled.

``ShardCopies.ensure`` is the path every ``get``, ``fetch`` and fetch ahead of a
``ShardCache`` ends in: check the copy (size, and the checksum as ``verify`` says), else
take the shard's fill lock (one download per shard per node, other processes wait), check
again and fill it (``fill.fill_shard``), counting hits, misses, waits and failures.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashfeed import storage
from flashfeed.crypto import cached_info
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.format.manifest import ShardInfo

from .errors import CacheFullError, CacheOverCapacityError
from .fetch.aimd import AdaptiveLimit
from .fetch.fill import FillSource, fill_shard
from .fetch.ranged import FetchReport, RangedFetcher
from .hints import ReadHints
from .layout import DatasetDir
from .locks import FileLock
from .space import SpaceManager
from .stats import COUNTERS, Counters

__all__ = ["ShardCopies"]

log = logging.getLogger("flashfeed.cache")


@dataclass(eq=False, kw_only=True)
class ShardCopies:
    """Verified local copies, filled under the shard's lock when missing or corrupt."""

    verify: str
    counters: Counters
    fetcher: RangedFetcher
    limit: AdaptiveLimit
    space: SpaceManager
    storage_options: dict[str, Any] | None
    hints: ReadHints
    peers: Any = None  # a ``flashfeed.cache.peer.PeerTier``: misses ask peers first
    #: each miss's counters on disk before its shard is visible, so that the processes
    #: sharing a cache count every fetch, a kill between the two included. The node
    #: service, the one writer of its cache, whose own accounts are the record, turns it
    #: off: its counters are flushed every 2 s (that write cost more than a small
    #: shard's fetch, and made a cold epoch through the service 0.83-0.86 of the embedded
    #: cache's on 2 cores, where both sides pay the same fill otherwise)
    durable_misses: bool = True
    _verified: dict[str, tuple[int, int, int]] = field(default_factory=dict, init=False)
    #: this process's counters of each dataset (by its cache key): a mixture's sources share
    #: one cache, and each reports its own
    _own: dict[str, dict[str, float]] = field(default_factory=dict, init=False)
    _own_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _count(self, d: DatasetDir, **values: float) -> None:
        """Add to the cache's counters and to ``d``'s own."""
        self.counters.add(**values)
        with self._own_lock:
            own = self._own.setdefault(d.key, dict.fromkeys(COUNTERS, 0))
            for k, v in values.items():
                own[k] += v

    def dataset_counters(self, d: DatasetDir) -> dict[str, float]:
        """The counters of one dataset's shards in this process (zeros before any use)."""
        with self._own_lock:
            return dict(self._own.get(d.key) or dict.fromkeys(COUNTERS, 0))

    def ensure(self, dataset: Dataset, d: DatasetDir, i: int, speculative: bool = False) -> str:
        """The path of a good copy of shard ``i``, filling it first if needed (blocks)."""
        path = d.shard_path(i)
        if self._usable(path, cached_info(dataset.manifest, dataset.shards[i])) is True:
            _touch(path)
            self._count(d, hits=1)
            return path
        return self._fill(dataset, d, i, speculative)

    def _usable(self, path: str, info: ShardInfo) -> bool | None:
        """True: good copy. False: present but corrupt. None: absent."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if st.st_size != info.bytes:
            return False
        ident = (st.st_dev, st.st_ino, st.st_size)
        mode = self.verify
        if mode == "never" or (mode == "once" and self._verified.get(path) == ident):
            return True
        try:
            ok = storage.file_checksum(path) == info.checksum
        except FileNotFoundError:
            return None
        if ok:
            self._verified[path] = ident
        return ok

    def _fill(self, dataset: Dataset, d: DatasetDir, i: int, speculative: bool) -> str:
        path = d.shard_path(i)
        lock = FileLock(d.fill_lock(i))
        waited = not lock.acquire(blocking=False)
        if waited:
            lock.acquire()
        try:
            state = self._usable(path, cached_info(dataset.manifest, dataset.shards[i]))
            if state is True:
                _touch(path)
                self._count(d, hits=1, shared_waits=int(waited))
                return path
            if state is False:
                log.warning("cached shard %s is corrupt; fetching it again", path)
                self._count(d, corrupt_refetches=1)
                for p in (path, path + ".idx"):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
            start = time.monotonic()

            def count_miss(report: FetchReport) -> None:
                # flushed before the shard is visible: a kill between the two must not
                # leave a cached shard whose fetch no counter remembers
                self._count(
                    d,
                    misses=1,
                    bytes_fetched=dataset.shards[i].bytes,
                    fetch_seconds=time.monotonic() - start,
                    requests=report.requests,
                    retries=report.retries,
                    throttle_events=report.throttles,
                )
                self.counters.set_gauges(
                    concurrency=self.limit.limit, concurrency_lowest=self.limit.lowest
                )
                if self.durable_misses:
                    self.counters.flush()

            def fill(source: FillSource | None) -> None:
                fill_shard(
                    d,
                    i,
                    dataset,
                    fetcher=self.fetcher,
                    reserve=lambda need, part: self.space.reserve(
                        d, i, need, part, speculative=speculative
                    ),
                    storage_options=self.storage_options,
                    priority=self.hints.priority(d.key, i, speculative=speculative),
                    verified=count_miss,
                    source=source,
                )

            try:
                self._fill_from_peers(dataset, d, i, fill)
            except CacheOverCapacityError:
                self._count(d, over_capacity=1)
                raise
            except CacheFullError:
                self._count(d, **{"fetch_ahead_skipped" if speculative else "failures": 1})
                raise
            except BaseException:
                self._count(d, failures=1)
                raise
            st = os.stat(path)
            self._verified[path] = (st.st_dev, st.st_ino, st.st_size)
            return path
        finally:
            lock.release()

    def _fill_from_peers(
        self, dataset: Dataset, d: DatasetDir, i: int, fill: Callable[[FillSource | None], None]
    ) -> None:
        """``fill`` from peers first (``self.peers``), then the store: a fill whose bytes or
        index from peers do not match the manifest runs anew without those peers."""
        source = None
        if self.peers is not None and not dataset.in_place:  # units of files: from the store
            source = self.peers.attempt(
                dataset, d, i, storage_options=self.storage_options, connections=self.limit.maximum
            )
        while True:
            try:
                fill(source)
                return
            except CorruptShardError as exc:
                if source is None or not source.used:
                    raise
                self.counters.add(corrupt_refetches=1)
                self.peers.distrust(source, str(exc))
                source = self.peers.attempt(
                    dataset,
                    d,
                    i,
                    storage_options=self.storage_options,
                    connections=self.limit.maximum,
                )


def _touch(path: str) -> None:
    """Mark a use in the copy's mtime: eviction without an order removes the oldest use."""
    try:
        os.utime(path)
    except OSError:
        pass
