"""Where shard bytes come from: a local dataset read in place, or the node cache.

A ``ShardSource`` turns a shard number into a local file path (fetching it first if needed)
and knows its sample index. Sources are picklable, so DALI's reader processes and torch
``DataLoader`` workers use the same one; the plan tells a source what comes next.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from flashfeed import storage
from flashfeed.dataset import Dataset, check_shard_checksum
from flashfeed.errors import CorruptShardError, ManifestError
from flashfeed.format.wdsindex import SampleIndex, parse_index
from flashfeed.telemetry import default_cache_dir

from . import verified

if TYPE_CHECKING:
    from flashfeed.cache import PartialShard

__all__ = [
    "CacheShardSource",
    "LocalShardSource",
    "ShardSource",
    "open_dataset",
    "open_source",
]


@runtime_checkable
class ShardSource(Protocol):
    """The loader's view of shard storage."""

    def local_path(self, shard: int) -> str:
        """A local, verified copy of ``shard`` (blocks until it is there). Called from the
        read-ahead's threads, several shards at a time."""
        ...

    def index(self, shard: int) -> list[SampleIndex]:
        """The ``.idx`` entries of a tar shard."""
        ...

    def fetch_ahead(self, shards: Sequence[int]) -> None:
        """Start fetching these shards in the background (a hint)."""
        ...

    def need(
        self, shard: int, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> None:
        """Row ``rows[j]`` of ``shard`` is first needed by batch ``batches[j]`` of this pass:
        fetches put the bytes needed sooner first (a hint)."""
        ...

    def set_future(self, shards: Sequence[int]) -> None:
        """The shards this process reads next, in order (for eviction)."""
        ...

    def partial(self, shard: int) -> PartialShard | None:
        """The shard while it is still arriving (its samples readable as their bytes land),
        or None: it is complete, not being fetched, or the source does not stream."""
        ...

    def stats(self) -> dict[str, Any]: ...


def reads_in_place(source: ShardSource) -> bool:
    """The source reads local files in place: nothing is fetched, nothing streams."""
    return isinstance(source, LocalShardSource) or bool(getattr(source, "in_place", False))


def node_service() -> str | None:
    """The node service's socket when ``$FLASHFEED_NODE_SOCKET`` selects one (see
    ``flashfeed.cache.node``); None: the embedded cache, as without a service."""
    return os.environ.get("FLASHFEED_NODE_SOCKET") or None


def node_cache_dir(cache_dir: str | None, url: str) -> str | None:
    """The node cache a loader uses: the given directory; for a remote dataset without one,
    ``FLASHFEED_CACHE_DIR`` or ``~/.cache/flashfeed``; None for a local dataset read in place.
    """
    if cache_dir is None and not storage.is_local(url):
        return default_cache_dir()
    return cache_dir


def open_dataset(
    dataset: str | Dataset,
    storage_options: dict[str, Any] | None = None,
    *,
    cache_dir: str | None = None,
    cache: Any = None,
    version: str | None = None,
) -> Dataset:
    """The dataset at a URL. A remote dataset's manifest comes through the node cache (the
    one the loader will read shards through), so it reaches a node once, not once per rank;
    the store is asked for its current version at each opening (``node_manifest``).

    ``version``: a dataset version (``Manifest.digest``) to read instead of the current
    one, e.g. the one a saved loader state names; refused when it is nowhere to be found.
    """
    if version is not None and (not isinstance(version, str) or not version):
        raise ValueError(f"dataset_version must be a version string, got {version!r}")
    if isinstance(dataset, Dataset):
        if version is not None and dataset.manifest.digest != version:
            raise ValueError(
                f"dataset_version={version!r} but the Dataset given is version "
                f"{dataset.manifest.digest}: give its URL to open another version"
            )
        return dataset
    if not isinstance(dataset, str):
        raise ValueError(f"dataset must be a URL or a Dataset, got {type(dataset).__name__}")
    root = cache.root if cache is not None else node_cache_dir(cache_dir, dataset)
    if cache is None and cache_dir is None and node_service() is not None:
        root = None  # the node service's cache is not this user's: read the manifest itself
    if root is None or storage.is_local(dataset):
        opened = Dataset.open(dataset, storage_options=storage_options)
        if version is not None and opened.manifest.digest != version:
            raise ManifestError(
                f"version {version} of {dataset} is gone: it holds version "
                f"{opened.manifest.digest} now (a local dataset is read in place, no copy "
                "of another version is kept)"
            )
        return opened
    from flashfeed.cache import node_manifest

    manifest = node_manifest(root, dataset, storage_options=storage_options, version=version)
    return Dataset(dataset, manifest, storage_options=storage_options)


class LocalShardSource:
    """Shards of a dataset on a local file system, read in place.

    The first use of a shard in a process checks its size and checksum against the manifest
    (``verify=True``), so a truncated or replaced shard fails with its name, not mid-decode.
    The checksum is hashed once per node while the file stays unchanged (``verified``: a
    record of the hash in the node's cache directory stands for it in later processes).
    """

    def __init__(self, dataset: Dataset, *, verify: bool = True) -> None:
        if not storage.is_local(dataset.url):
            raise ValueError(
                f"{dataset.url} is not on a local file system: give cache_dir= (or a "
                "ShardCache) so its shards are fetched to node-local storage first"
            )
        if dataset.encrypted:
            raise ValueError(
                f"{dataset.url} is encrypted: give cache_dir= (or a ShardCache) so its "
                "shards are decrypted into the node cache before they are read"
            )
        self.dataset = dataset
        self.verify = verify
        #: where this node keeps records of shards hashed (None: hash in every process)
        self.records = verified.records_dir() if verify else None
        #: shards checked by hashing their bytes, and by a record of an earlier hash
        self._hashed = self._recalled = 0
        #: shard -> its checked local path (resolved once: the read-ahead asks again per pass)
        self._checked: dict[int, str] = {}
        self._hits = 0
        self._lock = threading.Lock()  # the read-ahead checks several shards side by side

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_checked"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def local_path(self, shard: int) -> str:
        known = self._checked.get(shard)
        if known is None:
            info = self.dataset.shards[shard]
            _, path = storage.filesystem(self.dataset.shard_url(shard))
            if not os.path.isfile(path):
                raise CorruptShardError(
                    f"shard {info.path} of dataset {self.dataset.url} is missing ({path})"
                )
            if self.verify:
                hashed = _verify_file(path, info, dataset=self.dataset.url, records=self.records)
                with self._lock:
                    self._hashed += hashed
                    self._recalled += not hashed
            known = self._checked[shard] = str(path)
        with self._lock:
            self._hits += 1
        return known

    def index(self, shard: int) -> list[SampleIndex]:
        return self.dataset.read_index(shard)

    def fetch_ahead(self, shards: Sequence[int]) -> None:
        return None

    def need(
        self, shard: int, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> None:
        return None

    def set_future(self, shards: Sequence[int]) -> None:
        return None

    def partial(self, shard: int) -> PartialShard | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "hits": self._hits,
            "misses": 0,
            "checked_by_hash": self._hashed,
            "checked_by_record": self._recalled,
        }


def _verify_file(path: str, info: Any, *, dataset: str, records: str | None) -> bool:
    """Check size and checksum; True when the bytes were hashed (not a record's)."""
    st = os.stat(path)
    size = st.st_size
    if size == 0 or size != info.bytes:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset} has {size} bytes, the manifest says "
            f"{info.bytes} (truncated or replaced)"
        )
    got, hashed = verified.checksum(path, st, expected=info.checksum, records=records)
    check_shard_checksum(got, info, dataset=dataset)
    return hashed


class CacheShardSource:
    """Shards through the node-local ``flashfeed.cache.ShardCache`` (shared by all ranks
    and workers of the node; one download per shard per node).

    The process that made it fetches and verifies through the cache. In another process
    (a DALI reader or ``DataLoader`` worker) a shard the cache already holds is opened
    directly; one it lacks is fetched through a ``ShardCache`` of that process, opened from
    the cache's handle: same directory, file locks and options (capacity included).
    """

    def __init__(self, dataset: Dataset, cache: Any) -> None:
        self.dataset = dataset
        self.cache = cache
        self.view = cache.view(dataset)
        self.capacity = int(cache.capacity)
        self.handle = cache.handle()
        self._owner = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["cache"], state["_owner"] = None, -1
        return state

    def _cache(self) -> Any:
        if self._owner != os.getpid():  # a forked or spawned worker: its own ShardCache
            self.cache = self.handle.open()
            self._owner = os.getpid()
        return self.cache

    def local_path(self, shard: int) -> str:
        info = self.dataset.shards[shard]
        if self._owner != os.getpid():
            direct = self.view.ready_path(shard)
            if direct is not None:
                return direct
        try:
            path = str(self._cache().get(self.dataset, shard))
        except FileNotFoundError as exc:
            raise CorruptShardError(
                f"shard {info.path} of dataset {self.dataset.url} is missing ({exc})"
            ) from None
        return path

    def index(self, shard: int) -> list[SampleIndex]:
        cached = self.view.cached_index(shard)
        if cached is not None:
            return cached
        partial = self.partial(shard)  # a shard still arriving: its index came first
        if partial is not None:
            partial.progress.close()
            return partial.index
        path = self.local_path(shard) + ".idx"
        with open(path, "rb") as f:
            return parse_index(f.read(), source=path)

    def ready_path(self, shard: int) -> str | None:
        """The cached copy's path if the shard is complete now (no fetch, no wait)."""
        return self.view.ready_path(shard)

    def partial(self, shard: int) -> PartialShard | None:
        """A fill of ``shard`` running now in any process of the node (``DatasetView``)."""
        return self.view.partial(shard)

    def fetch_ahead(self, shards: Sequence[int]) -> None:
        self._cache().fetch_ahead(self.dataset, list(shards))

    def need(
        self, shard: int, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> None:
        self._cache().need(self.dataset, shard, rows, batches)

    def set_future(self, shards: Sequence[int]) -> None:
        self._cache().set_future(self.dataset, list(shards))

    def hold_fetches(self, beyond_batch: int, *, seconds: float, trickle: int = 0) -> None:
        self._cache().hold_fetches(beyond_batch, seconds=seconds, trickle=trickle)

    def release_fetches(self) -> None:
        self._cache().release_fetches()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "cache"}
        try:
            out.update(self._cache().stats())
        except Exception as exc:  # a stats failure must not stop training
            out["error"] = str(exc)
        return out

    def own_stats(self) -> dict[str, Any]:
        """The counters of this dataset's shards only, not the whole cache's."""
        out: dict[str, Any] = {"kind": "cache"}
        try:
            out.update(self._cache().dataset_stats(self.dataset))
        except Exception as exc:  # a stats failure must not stop training
            out["error"] = str(exc)
        return out


def open_source(
    dataset: Dataset,
    *,
    cache_dir: str | None = None,
    cache: Any = None,
    cache_capacity: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ShardSource:
    """The source a loader reads from: an explicit cache, a cache in ``cache_dir``, the
    node service when ``$FLASHFEED_NODE_SOCKET`` names one, or the dataset in place when it
    is local.

    ``cache_capacity`` None opens the cache in ``cache_dir`` with the capacity it records
    (set by whoever created it, e.g. ``flashfeed cache warm``); a given one replaces it.
    """
    if cache is not None:
        return CacheShardSource(dataset, cache)
    files = dataset.in_place
    if files is not None and storage.is_local(files.root):  # ranges of local files, in place
        from .unitread import LocalUnitSource

        return LocalUnitSource(dataset)  # type: ignore[return-value]
    if cache_dir is None and not storage.is_local(dataset.url) and node_service() is not None:
        from flashfeed.cache import NodeShardSource

        return NodeShardSource(dataset, storage_options=storage_options)
    cache_dir = node_cache_dir(cache_dir, dataset.url if files is None else files.root)
    if cache_dir is None:
        return LocalShardSource(dataset)
    try:
        from flashfeed.cache import ShardCache
    except ImportError as exc:
        raise ValueError(
            f"cache_dir={cache_dir!r} needs flashfeed.cache.ShardCache, which is not "
            f"importable ({exc})"
        ) from None
    return CacheShardSource(
        dataset,
        ShardCache(cache_dir, capacity=cache_capacity, storage_options=storage_options),
    )
