"""``ShardCache``: the node-local shard cache shared by every process on a node."""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from flashfeed.crypto import cached_info
from flashfeed.dataset import Dataset
from flashfeed.manifest import ShardInfo
from flashfeed.storage import RetryPolicy
from flashfeed.units import format_size, parse_size

from .ahead import FetchAhead
from .aimd import AdaptiveLimit
from .errors import CacheCapacityError, CacheFullError
from .fill import file_checksum, fill_shard
from .handle import CacheHandle
from .layout import (
    DatasetDir,
    atomic_write_json,
    check_private_root,
    dataset_key,
    list_dataset_dirs,
    make_private_dir,
    sweep_dead_tmp,
)
from .locks import FileLock
from .needorder import SPECULATIVE, URGENT, PartPriority, ShardNeed
from .options import CacheOptions
from .policy import FutureOrder
from .progress import FillView, live_path
from .ranged import RangedFetcher
from .space import SpaceManager, settle_capacity, sweep_dead_parts
from .stats import Counters
from .view import DatasetView, PartialShard
from .warmrecord import read_warm_records, write_warm_record

__all__ = ["ShardCache"]

log = logging.getLogger("flashfeed.cache")


class ShardCache:
    """Shards of committed datasets on local disk: fetched once per node, verified, bounded.

    >>> cache = ShardCache("/nvme/ff-cache", capacity="500GiB")      # doctest: +SKIP
    >>> path = cache.get(Dataset.open("s3://flashfeed/photos"), 0)    # doctest: +SKIP

    ``get`` returns the path of a complete, checksum-verified copy. A shard may be evicted
    once ``get`` has returned unless it is pinned or read inside ``with cache.open(...)``.

    The capacity belongs to the cache: ``capacity=None`` adopts the one recorded in ``root``
    (a new cache records 80% of the free space plus what it already holds); a given capacity
    is honoured and recorded, and a change is logged naming the old and the new value.
    ``handle()`` reopens the cache with all these options in another process.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        capacity: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
        part_size: int | str = "16MiB",
        concurrency: int = 8,
        min_concurrency: int = 1,
        fetch_ahead_workers: int = 4,
        verify: str = "once",
        space_timeout: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        given = None if capacity is None else parse_size(capacity, name="capacity")
        options = CacheOptions.build(  # every value checked before the disk is touched
            capacity=1 if given is None else given,
            part_size=part_size,
            concurrency=concurrency,
            min_concurrency=min_concurrency,
            fetch_ahead_workers=fetch_ahead_workers,
            verify=verify,
            space_timeout=space_timeout,
            retry=retry,
        )
        self.root = os.path.abspath(os.fspath(root))
        make_private_dir(self.root)
        check_private_root(self.root)
        self.options = replace(options, capacity=settle_capacity(self.root, given))
        self.storage_options = storage_options
        self.counters = Counters(self.root)
        self.limit = AdaptiveLimit(concurrency, minimum=min_concurrency)
        self._ahead = FetchAhead(fetch_ahead_workers)
        self.fetcher = RangedFetcher(
            part_size=self.options.part_size,
            limit=self.limit,
            retry=self.options.retry_policy,
        )
        self.space = SpaceManager(
            self.root,
            capacity=self.options.capacity,
            counters=self.counters,
            next_use=self._next_use,
            timeout=self.options.space_timeout,
        )
        self._lock = threading.Lock()
        self._dirs: dict[int, tuple[Any, DatasetDir]] = {}
        self._futures: dict[str, FutureOrder] = {}
        self._verified: dict[str, tuple[int, int, int]] = {}
        self._needs: dict[tuple[str, int], ShardNeed] = {}
        self.fetch_ahead_errors: dict[Any, BaseException] = self._ahead.errors
        self._closed = False
        self._used, self._used_at = 0, -1e9
        self._used = self.space.used_bytes()  # also sweeps the part files of dead fills
        for directory in [self.root, *(d.dir for d in list_dataset_dirs(self.root))]:
            sweep_dead_tmp(directory)
        atexit.register(self.counters.flush)

    @property
    def capacity(self) -> int:
        return self.options.capacity

    def handle(self) -> CacheHandle:
        """What another process needs to open this cache with these very options."""
        storage_options = None if self.storage_options is None else dict(self.storage_options)
        return CacheHandle(self.root, self.options, storage_options)

    # -- datasets ---------------------------------------------------------------------------
    def dataset_dir(self, dataset: Dataset) -> DatasetDir:
        """The cache directory of a dataset; checks the capacity on first sight."""
        return self._register(dataset)

    def _register(self, dataset: Dataset) -> DatasetDir:
        with self._lock:
            known = self._dirs.get(id(dataset.manifest))
            if known is not None:
                return known[1]
        sizes = dataset.manifest.shard_bytes
        if len(sizes):
            biggest = dataset.shards[int(sizes.argmax())]
            if biggest.bytes > self.capacity:
                raise CacheCapacityError(
                    f"cache capacity {format_size(self.capacity)} ({self.root}) is smaller than "
                    f"shard {biggest.path} of {dataset.url} ({format_size(biggest.bytes)}): "
                    f"give the cache at least {format_size(biggest.bytes)}, better the node's "
                    "whole share of the dataset"
                )
        d = DatasetDir(self.root, dataset_key(dataset.url, dataset.manifest))
        d.create(dataset.url, dataset.manifest)
        sweep_dead_parts(d)
        with self._lock:
            self._dirs[id(dataset.manifest)] = (dataset.manifest, d)
        return d

    def _resolve(self, dataset: Dataset, shard: int | ShardInfo) -> tuple[DatasetDir, int]:
        d = self._register(dataset)
        if isinstance(shard, ShardInfo):
            try:
                return d, dataset.manifest.find_shard(shard.path)
            except (KeyError, ValueError):
                raise KeyError(f"{dataset.url} has no shard {shard.path!r}") from None
        n = len(dataset.shards)
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
            raise IndexError(f"shard must be an int in [0, {n}) for {dataset.url}, got {shard!r}")
        return d, shard

    # -- reading ----------------------------------------------------------------------------
    def get(self, dataset: Dataset, shard: int | ShardInfo) -> str:
        """The local path of a verified copy of the shard, fetching it if needed (blocks).

        Its index, if the shard has one, is beside it as ``path + ".idx"``.
        """
        d, i = self._resolve(dataset, shard)
        with self._lock:
            future = self._futures.get(d.key)
            if future is not None:
                future.advance(i)
        return self._ensure(dataset, d, i)

    def fetch(self, dataset: Dataset, shard: int | ShardInfo) -> str:
        """Fetch now and block (``warm``): like ``get`` but not a read, so the position in
        the future order stays where it is, and only shards needed later than this one are
        evicted for it (``CacheFullError`` at once otherwise)."""
        d, i = self._resolve(dataset, shard)
        return self._ensure(dataset, d, i, speculative=True)

    @contextmanager
    def open(self, dataset: Dataset, shard: int | ShardInfo) -> Iterator[str]:
        """``get`` and keep the shard marked in use (for every process) inside the block."""
        d, i = self._resolve(dataset, shard)
        use = FileLock(d.use_lock(i))
        use.acquire(shared=True)
        try:
            yield self.get(dataset, i)
        finally:
            use.release()

    def contains(self, dataset: Dataset, shard: int | ShardInfo) -> bool:
        """True if a complete copy is present (not verified)."""
        d, i = self._resolve(dataset, shard)
        return os.path.exists(d.shard_path(i))

    def view(self, dataset: Dataset) -> DatasetView:
        """A picklable reader's view of the dataset's shards here (no fetch, no lock)."""
        d = self._register(dataset)
        return DatasetView(dataset, d.data_dir, d.parts_dir)

    def ready_path(self, dataset: Dataset, shard: int | ShardInfo) -> str | None:
        """The complete copy's path, or None (no fetch, no wait; not verified)."""
        _, i = self._resolve(dataset, shard)
        return self.view(dataset).ready_path(i)

    def partial(self, dataset: Dataset, shard: int | ShardInfo) -> PartialShard | None:
        """The live fill of ``shard``: part file, index and progress (``DatasetView``)."""
        _, i = self._resolve(dataset, shard)
        return self.view(dataset).partial(i)

    def progress(self, dataset: Dataset, shard: int | ShardInfo) -> FillView | None:
        """The fill of ``shard`` running now in any process of the node, or None: which of
        its bytes have arrived in the part file (see ``progress.py``)."""
        d, i = self._resolve(dataset, shard)
        return FillView.open(live_path(d.parts_dir, i))

    def _ensure(self, dataset: Dataset, d: DatasetDir, i: int, speculative: bool = False) -> str:
        path = d.shard_path(i)
        if self._usable(path, cached_info(dataset.manifest, dataset.shards[i])) is True:
            self._touch(path)
            self.counters.add(hits=1)
            return path
        return self._fill(dataset, d, i, speculative)

    def _priority(self, d: DatasetDir, i: int, speculative: bool) -> PartPriority:
        with self._lock:
            need = self._needs.get((d.key, i))
        return PartPriority(need, default=SPECULATIVE if speculative else URGENT)

    def _usable(self, path: str, info: ShardInfo) -> bool | None:
        """True: good copy. False: present but corrupt. None: absent."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if st.st_size != info.bytes:
            return False
        ident = (st.st_dev, st.st_ino, st.st_size)
        mode = self.options.verify
        if mode == "never" or (mode == "once" and self._verified.get(path) == ident):
            return True
        try:
            ok = file_checksum(path) == info.checksum
        except FileNotFoundError:
            return None
        if ok:
            self._verified[path] = ident
        return ok

    def _touch(self, path: str) -> None:
        try:
            os.utime(path)
        except OSError:
            pass

    def _fill(self, dataset: Dataset, d: DatasetDir, i: int, speculative: bool) -> str:
        path = d.shard_path(i)
        lock = FileLock(d.fill_lock(i))
        waited = not lock.acquire(blocking=False)
        if waited:
            lock.acquire()
        try:
            state = self._usable(path, cached_info(dataset.manifest, dataset.shards[i]))
            if state is True:
                self._touch(path)
                self.counters.add(hits=1, shared_waits=int(waited))
                return path
            if state is False:
                log.warning("cached shard %s is corrupt; fetching it again", path)
                self.counters.add(corrupt_refetches=1)
                for p in (path, path + ".idx"):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
            start = time.monotonic()
            try:
                report = fill_shard(
                    d,
                    i,
                    dataset,
                    fetcher=self.fetcher,
                    reserve=lambda need, part: self.space.reserve(
                        d, i, need, part, speculative=speculative
                    ),
                    storage_options=self.storage_options,
                    priority=self._priority(d, i, speculative),
                )
            except CacheFullError:
                self.counters.add(**{"fetch_ahead_skipped" if speculative else "failures": 1})
                raise
            except BaseException:
                self.counters.add(failures=1)
                raise
            st = os.stat(path)
            self._verified[path] = (st.st_dev, st.st_ino, st.st_size)
            self.counters.add(
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
            self.counters.flush()
            return path
        finally:
            lock.release()

    # -- read-ahead and eviction hints ------------------------------------------------------
    def fetch_ahead(self, dataset: Dataset, shards: Iterable[int]) -> None:
        """Fetch shards in the background (in the given order); returns at once.

        A fetch ahead never evicts a shard needed sooner than the one it fetches. Failures
        are counted and kept in ``fetch_ahead_errors``; a later ``get`` retries.
        """
        d = self._register(dataset)
        for shard in shards:
            _, i = self._resolve(dataset, shard)
            self._ahead.submit(
                (d.key, i),
                functools.partial(self._ensure, dataset, d, i, speculative=True),
                f"shard {i} of {dataset.url}",
            )

    def wait_fetch_ahead(self, timeout: float | None = None) -> None:
        """Block until the fetches ahead queued so far have finished (or failed)."""
        self._ahead.wait(timeout)

    def need(
        self,
        dataset: Dataset,
        shard: int | ShardInfo,
        rows: Sequence[int] | Any,
        batches: Sequence[int] | Any,
    ) -> None:
        """When this process needs which samples of ``shard``: ``rows[j]`` (its index in the
        shard's ``.idx``) is first needed by batch ``batches[j]`` of the current pass.

        Fills of this process then fetch the parts of all shards in flight in need order:
        each part when the first batch needing a sample in it comes (the shard's first
        batch until its index has arrived), parts with no needed sample with the shard's
        last batch. Without a need, a ``get`` goes first and a fetch ahead last.
        ``set_future`` starts a new pass and forgets the needs of the last one.
        """
        d, i = self._resolve(dataset, shard)
        need = ShardNeed.build(rows, batches)
        with self._lock:
            self._needs[(d.key, i)] = need

    def set_future(
        self, dataset: Dataset, shards_in_order: Sequence[int], *, active: int = 4
    ) -> None:
        """The upcoming read order (the plan's): eviction then removes the shard read last.

        ``get`` advances the position in it; the shards of the last ``active`` reads count
        as still being read (the plan mixes a window of shards at once).
        """
        d = self._register(dataset)
        order = FutureOrder(shards_in_order, active=active)
        with self._lock:
            self._futures[d.key] = order
            self._needs = {k: v for k, v in self._needs.items() if k[0] != d.key}
        atomic_write_json(d.future_path, {"order": order.order, "updated": time.time()})

    def record_warm(self, record: dict[str, Any]) -> None:
        """Remember for which node share ``record["url"]`` was warmed (``cache warm``)."""
        write_warm_record(self.root, record)

    def warm_record(self, url: str) -> dict[str, Any] | None:
        """The last warm record of the dataset at ``url`` in this cache, if any."""
        return read_warm_records(self.root).get(url.rstrip("/"))

    def _next_use(self, key: str, shard: int) -> float:
        with self._lock:
            future = self._futures.get(key)
            return future.next_use(shard) if future is not None else math.inf

    def pin(self, dataset: Dataset, shard: int | ShardInfo) -> None:
        """Never evict this shard (for every process) until ``unpin``."""
        d, i = self._resolve(dataset, shard)
        fd = os.open(d.pin_path(i), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)

    def unpin(self, dataset: Dataset, shard: int | ShardInfo) -> None:
        d, i = self._resolve(dataset, shard)
        try:
            os.unlink(d.pin_path(i))
        except FileNotFoundError:
            pass

    # -- reporting and lifetime -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """This process's counters, the current and lowest concurrency, and the bytes held."""
        out: dict[str, Any] = dict(self.counters.snapshot())
        seconds = out["fetch_seconds"]
        out["fetch_gbps"] = out["bytes_fetched"] / seconds / 1e9 if seconds else 0.0
        out["concurrency"] = self.limit.limit
        out["concurrency_max"] = self.limit.maximum
        out["concurrency_lowest"] = self.limit.lowest
        out["capacity"] = self.capacity
        now = time.monotonic()
        if now - self._used_at > 2.0:  # a directory scan: at most every 2 s
            self._used, self._used_at = self.space.used_bytes(), now
        out["used_bytes"] = self._used
        return out

    def used_bytes(self) -> int:
        """Bytes held now (complete shards, indexes and fills in progress), by a scan."""
        return self.space.used_bytes()

    def close(self) -> None:
        """Finish queued fetches ahead, stop the threads and persist the counters."""
        if self._closed:
            return
        self._closed = True
        self._ahead.close()
        self.fetcher.close()
        self.counters.flush()
        atexit.unregister(self.counters.flush)

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
