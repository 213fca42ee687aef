"""``ShardCache``: the node-local shard cache shared by every process on a node.

The class is the public face; the work is delegated: ``copies`` (check a copy, fill it under
the shard's lock), ``hints`` (the read order and needs this process gave), ``space``
(capacity and eviction), ``ranged`` (the downloads), ``ahead`` (fetches in the background).
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.format.manifest import ShardInfo
from flashfeed.runtime.files import sweep_dead_tmp
from flashfeed.s3.directget import signed_endpoint, warm_client
from flashfeed.storage import RetryPolicy
from flashfeed.units import format_size, parse_size

from .ahead import FetchAhead
from .copies import ShardCopies
from .errors import CacheCapacityError
from .fetch.aimd import AdaptiveLimit
from .fetch.needorder import ShardNeed
from .fetch.ranged import RangedFetcher
from .handle import CacheHandle
from .hints import ReadHints
from .layout import DatasetDir, check_private_root, dataset_key, list_dataset_dirs, make_private_dir
from .locks import FileLock
from .options import CacheOptions
from .progress import FillView, live_path
from .space import SpaceManager, settle_capacity, sweep_dead_parts
from .stats import Counters
from .view import DatasetView, PartialShard
from .warmrecord import read_warm_records, write_warm_record

__all__ = ["ShardCache"]


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

    ``peers`` (a ``flashfeed.cache.peer.PeerTier``): a miss is read from the cluster's other
    nodes before the store, checked against the manifest all the same (docs/CACHE.md).
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
        peers: Any = None,
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
        self.hints = ReadHints()
        self.fetcher = RangedFetcher(
            part_size=self.options.part_size,
            limit=self.limit,
            retry=self.options.retry_policy,
        )
        self.space = SpaceManager(
            self.root,
            capacity=self.options.capacity,
            counters=self.counters,
            next_use=self.hints.next_use,
            timeout=self.options.space_timeout,
        )
        self.copies = ShardCopies(
            verify=self.options.verify,
            counters=self.counters,
            fetcher=self.fetcher,
            limit=self.limit,
            space=self.space,
            storage_options=storage_options,
            hints=self.hints,
            peers=peers,
        )
        self._lock = threading.Lock()
        self._dirs: dict[int, tuple[Any, DatasetDir]] = {}
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
        peers = self.copies.peers
        spec = None if peers is None else peers.spec()
        return CacheHandle(self.root, self.options, storage_options, spec)

    # -- datasets ---------------------------------------------------------------------------
    def dataset_dir(self, dataset: Dataset) -> DatasetDir:
        """The cache directory of a dataset; checks the capacity on first sight."""
        return self._register(dataset)

    def open_dataset(self, url: str, *, version: str | None = None) -> Dataset:
        """The dataset at ``url`` with its manifest read through this cache
        (``node_manifest``): the store's current version, checked with one HEAD; the
        cache's copy when the store is away; ``version`` to read another one."""
        from .manifests import node_manifest

        opts = self.storage_options
        manifest = node_manifest(self.root, url, storage_options=opts, version=version)
        return Dataset(url, manifest, storage_options=opts)

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
        self._warm_client(dataset)
        return d

    def _warm_client(self, dataset: Dataset) -> None:
        """Set up the S3 client of the fills in the background as soon as a dataset on S3
        is known: the first fill then starts with its client ready."""
        if not dataset.url.startswith(("s3://", "s3a://")):
            return
        opts = self.storage_options
        opts = opts if opts is not None else dataset.storage_options
        if signed_endpoint(storage.S3Options.parse(opts)) is not None:
            return  # signed GETs of our own: no client to set up (and no s3fs to import)
        fs, _ = storage.filesystem(dataset.url, opts)
        warm_client(fs, connections=self.limit.maximum)

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
        self.hints.advance(d.key, i)
        return self.copies.ensure(dataset, d, i)

    def fetch(self, dataset: Dataset, shard: int | ShardInfo) -> str:
        """Fetch now and block (``warm``): like ``get`` but not a read, so the position in
        the future order stays where it is, and only shards needed later than this one are
        evicted for it (``CacheFullError`` at once otherwise)."""
        d, i = self._resolve(dataset, shard)
        return self.copies.ensure(dataset, d, i, speculative=True)

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
                functools.partial(self.copies.ensure, dataset, d, i, speculative=True),
                f"shard {i} of {dataset.url}",
            )

    def hold_fetches(self, beyond_batch: int, *, seconds: float = 3.0, trickle: int = 0) -> None:
        """For up to ``seconds`` (or until ``release_fetches``), run at most ``trickle``
        GETs at a time (0: none) of parts that no batch up to ``beyond_batch`` needs (see
        ``need``; a fetch ahead's parts included): a cold first batch then gets the
        requests and most of the CPU its decode shares with the download, while a trickle
        keeps the download from standing idle. Parts already started finish."""
        self.fetcher.queue.hold(beyond_batch, seconds=seconds, trickle=trickle)

    def release_fetches(self) -> None:
        """End ``hold_fetches``."""
        self.fetcher.queue.release()

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
        self.hints.set_need(d.key, i, ShardNeed.build(rows, batches))

    def set_future(
        self, dataset: Dataset, shards_in_order: Sequence[int], *, active: int = 4
    ) -> None:
        """The upcoming read order (the plan's): eviction then removes the shard read last.

        ``get`` advances the position in it; the shards of the last ``active`` reads count
        as still being read (the plan mixes a window of shards at once).
        """
        self.hints.set_future(self._register(dataset), shards_in_order, active=active)

    def set_mixture_future(
        self,
        datasets: Sequence[Dataset],
        order: Sequence[tuple[int, int]],
        *,
        active: int = 4,
    ) -> None:
        """The upcoming read order of a mixture of ``datasets``: ``(source number, shard)``
        pairs in the merged order, so eviction compares shards of all sources on one clock
        (``set_future`` per source cannot: each source's positions count its own reads).
        ``get`` advances it; each source's last ``active`` reads count as still being read.
        """
        dirs = [self._register(d) for d in datasets]
        pairs = [(int(s), int(i)) for s, i in order]
        self.hints.set_mixture_future(dirs, pairs, active=active)

    def record_warm(self, record: dict[str, Any]) -> None:
        """Remember for which node share ``record["url"]`` was warmed (``cache warm``)."""
        write_warm_record(self.root, record)

    def warm_record(self, url: str) -> dict[str, Any] | None:
        """The last warm record of the dataset at ``url`` in this cache, if any."""
        return read_warm_records(self.root).get(url.rstrip("/"))

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

    def dataset_stats(self, dataset: Dataset) -> dict[str, Any]:
        """This process's counters of one dataset's shards only (hits, misses, bytes
        fetched, ...): what a mixture reports per source of the cache they share."""
        out: dict[str, Any] = dict(self.copies.dataset_counters(self.dataset_dir(dataset)))
        seconds = out["fetch_seconds"]
        out["fetch_gbps"] = out["bytes_fetched"] / seconds / 1e9 if seconds else 0.0
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
