"""One fill: fetch a shard into its reserved part file, verify it, rename it into place.

The shard becomes visible only by ``rename`` after its checksum matched, its index first;
any failure removes the part files, so a reader sees a complete, verified shard or none.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import xxhash

from flashfeed import crypto, storage
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError, FlashfeedError, StorageError
from flashfeed.format.inplace import check_unit_bytes
from flashfeed.format.manifest import ShardInfo
from flashfeed.format.tarshard import scan_index
from flashfeed.format.wdsindex import parse_index
from flashfeed.s3.directget import RangedReader, reader_for_url
from flashfeed.units import format_size

from ..errors import CacheFullError
from ..layout import DatasetDir, make_private_dir
from ..locks import locked
from ..progress import FillProgress, live_path
from ..space import space_lock
from .needorder import PartPriority
from .ranged import FetchReport, RangedFetcher

__all__ = ["CHUNK", "FillSource", "OrderedHasher", "block_size", "fill_shard"]

Reserve = Callable[[int, str], int]


class FillSource(RangedReader, Protocol):
    """Where a fill reads a shard instead of the store's reader (the cluster tier's peers,
    falling back to the store): its ranges, and its index when it has one (``index_from``
    names who served it: the fill checks it against the verified shard)."""

    index_from: str | None

    def index(self) -> bytes | None: ...


#: bytes read from a response body at a time: small enough to stay in the CPU's cache
#: between the socket copy, the hash and the write, large enough to keep calls few
CHUNK = 1 << 20

_BUFFERS = threading.local()


def _buffer(size: int) -> memoryview:
    """This thread's reused receive buffer (a fetch thread lives as long as its cache)."""
    view: memoryview | None = getattr(_BUFFERS, "view", None)
    if view is None or len(view) < size:
        view = _BUFFERS.view = memoryview(bytearray(max(size, CHUNK)))
    return view[:size]


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class OrderedHasher:
    """The manifest checksum of a shard whose parts land out of order, checked in transit.

    ``add(offset, chunk)`` follows each write: a chunk that continues the hashed prefix is
    hashed then and there, from the receive buffer. ``landed(start, end)`` follows a whole
    part: what of it was not hashed in transit (it arrived ahead of a slower part) is hashed
    from the file through ``read(start, end)`` once the prefix reaches it. Nothing is held
    in memory, and the file is read back only for parts that overtook another."""

    def __init__(self, read: Callable[[int, int], Iterable[bytes | memoryview]]) -> None:
        self._hash = xxhash.xxh3_128()
        self._read = read
        self._next = 0
        self._waiting: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, offset: int, data: bytes | memoryview) -> bool:
        """``data`` was written at ``offset``; True if it was hashed now."""
        with self._lock:
            if offset != self._next:
                return False
            self._hash.update(data)
            self._next += len(data)
            return True

    def landed(self, start: int, end: int) -> None:
        """Every byte of ``[start, end)`` is in the file."""
        with self._lock:
            if self._next < end:
                self._waiting[max(start, self._next)] = end
            while self._next in self._waiting:
                stop = self._waiting.pop(self._next)
                for chunk in self._read(self._next, stop):
                    self._hash.update(chunk)
                self._next = stop

    def drop_pending(self) -> None:
        """Forget the parts waiting for a slower one (a fill that failed)."""
        with self._lock:
            self._waiting.clear()

    def checksum(self, size: int) -> str:
        with self._lock:
            if self._next != size or self._waiting:
                raise RuntimeError(f"hashed {self._next} of {size} bytes: a part is missing")
            return storage.CHECKSUM_PREFIX + self._hash.hexdigest()


class _FileBytes:
    """Ranges of the part file, read back through one memory map made on first use
    (cheaper here than copying them out with ``pread``: the pages are in memory)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._size = fd, size
        self._map: mmap.mmap | None = None

    def __call__(self, start: int, end: int) -> Iterator[memoryview]:
        if self._map is None:
            self._map = mmap.mmap(self._fd, self._size, access=mmap.ACCESS_READ)
        with memoryview(self._map) as view:
            for at in range(start, end, CHUNK):
                with view[at : min(at + CHUNK, end)] as chunk:
                    yield chunk

    def close(self) -> None:
        if self._map is not None:
            self._map.close()


class _Landed:
    """What a part's fetch returns when its bytes went straight to the file."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def block_size(part_size: int) -> int:
    """The span of one progress mark: a chunk where parts are whole chunks, else a part."""
    return CHUNK if part_size % CHUNK == 0 else part_size


def _fetch_to(
    fetcher: RangedFetcher,
    dataset: Dataset,
    info: ShardInfo,
    fd: int,
    opts: dict[str, Any] | None,
    meanwhile: Callable[[FetchReport], None] | None,
    hasher: OrderedHasher,
    progress: FillProgress | None = None,
    priority: PartPriority | None = None,
    source: FillSource | None = None,
) -> FetchReport:
    # a unit of a file indexed in place is a range of that file: its bytes start at ``base``
    # (peers serve whole shards of our own format only: ``ShardCopies`` gives them no unit)
    url, base = dataset.shard_range(info)
    direct = source if source is not None else _direct(url, opts, fetcher) if info.bytes else None
    fs: Any = None  # only where no lean reader reads it: making one imports s3fs
    path = ""
    if direct is None:
        fs, path = storage.filesystem(url, opts)
    chunk = min(CHUNK, fetcher.part_size)

    def landed(start: int, end: int) -> None:
        if progress is not None:
            progress.written(start, end)

    def fetch(start: int, end: int) -> bytes | memoryview | _Landed:
        if direct is None:
            return fs.cat_file(path, start=base + start, end=base + end)
        at = start  # each chunk: socket -> reused buffer -> hash (when in order) -> file
        for part in direct.chunks(base + start, base + end, _buffer(chunk)):
            _pwrite_all(fd, part, at)
            hasher.add(at, part)
            landed(at, at + len(part))
            at += len(part)
        return _Landed(end - start)

    def write(offset: int, data: bytes | memoryview | _Landed) -> None:
        if not isinstance(data, _Landed):
            _pwrite_all(fd, data, offset)
            hasher.add(offset, data)
        hasher.landed(offset, offset + len(data))
        landed(offset, offset + len(data))

    # in need order the index comes first: it ranks the parts before any is queued
    first, later = (meanwhile, None) if priority is not None else (None, meanwhile)
    try:
        return fetcher.fetch_into(
            fetch, info.bytes, write, meanwhile=later, before=first, priority=priority
        )
    except (FlashfeedError, CacheFullError):
        raise
    except FileNotFoundError:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset.url} is missing ({url} not found)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise
        raise StorageError(
            f"could not fetch shard {info.path} of {dataset.url} ({url}) from "
            f"{storage.endpoint(url, opts)}: "
            f"{storage.redact(f'{type(exc).__name__}: {exc}')}"
        ) from None
    except Exception as exc:
        raise StorageError(
            f"could not fetch shard {info.path} of {dataset.url} ({url}) from "
            f"{storage.endpoint(url, opts)}: "
            f"{storage.redact(f'{type(exc).__name__}: {exc}')} (retries exhausted)"
        ) from None
    finally:
        hasher.drop_pending()


def _direct(url: str, opts: dict[str, Any] | None, fetcher: RangedFetcher) -> RangedReader | None:
    if not url.startswith(("s3://", "s3a://")):
        return None
    return reader_for_url(url, opts, connections=fetcher.limit.maximum)


def _fetch_index(
    fetcher: RangedFetcher,
    dataset: Dataset,
    info: ShardInfo,
    url: str,
    opts: dict[str, Any] | None,
    report: FetchReport,
) -> bytes:
    direct = _direct(url, opts, fetcher)
    if direct is not None:
        read = direct.read
    else:
        fs, path = storage.filesystem(url, opts)
        read = lambda: fs.cat_file(path)  # noqa: E731
    try:
        data = fetcher.call(read, report, gated=False)
        return data if isinstance(data, bytes) else bytes(data)
    except FileNotFoundError:
        raise CorruptShardError(
            f"index {url} of shard {info.path} of {dataset.url} is missing"
        ) from None
    except Exception as exc:
        raise StorageError(
            f"could not fetch index {url} of shard {info.path} of {dataset.url}: "
            f"{storage.redact(f'{type(exc).__name__}: {exc}')} (retries exhausted)"
        ) from None


def _decrypt_in_place(part: str, dataset: Dataset, info: ShardInfo) -> None:
    """An encrypted shard is kept decrypted (0600) in the cache: the loader's hot path,
    memory maps and ``.idx`` offsets stay those of a plain shard. Authenticated first."""
    with open(part, "r+b") as f:
        sealed = f.read()
        plain = crypto.open_shard(
            dataset.manifest, info, sealed, dataset=dataset.url, key=dataset.encryption_key
        )
        del sealed
        f.seek(0)
        f.write(plain)
        f.truncate(len(plain))


def _check_index(part: str, index: bytes, dataset: Dataset, info: ShardInfo, who: str) -> None:
    """An index that did not come from the store (the manifest has no checksum of it) must
    be the one the verified shard's own tar headers give."""
    with open(part, "rb") as f:
        own = scan_index(f, source=f"{dataset.url} {info.path}")
    try:
        same = parse_index(index, source=who) == own
    except CorruptShardError:
        same = False
    if not same:
        raise CorruptShardError(
            f"the index of shard {info.path} of {dataset.url} from {who} does not match the "
            "shard's own tar headers"
        )


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def fill_shard(
    d: DatasetDir,
    shard: int,
    dataset: Dataset,
    *,
    fetcher: RangedFetcher,
    reserve: Reserve,
    storage_options: dict[str, Any] | None,
    publish: bool = True,
    priority: PartPriority | None = None,
    verified: Callable[[FetchReport], None] | None = None,
    source: FillSource | None = None,
) -> FetchReport:
    """Fetch shard ``shard`` into the cache; the caller holds its fill lock.

    With ``publish`` the parts that have arrived are announced (``progress.py``) so that
    readers can serve samples before the whole shard is there. ``priority`` ranks its
    parts among all parts in flight (``needorder.py``); it learns the index on arrival.
    ``verified`` runs once the checksum matched and before the shard becomes visible, so
    that what it records (the miss) is on disk before anyone can find the shard.
    ``source`` reads the shard (and its index) in place of the store (``FillSource``)."""
    info = dataset.shards[shard]
    final = d.shard_path(shard)
    part = d.new_part(shard)
    idx_part = d.new_part(shard, "idx")
    opts = storage_options if storage_options is not None else dataset.storage_options
    progress: FillProgress | None = None
    try:
        fd = reserve(info.bytes, part)
        index_url = dataset.index_url(info)
        index: list[bytes] = []
        if publish and not dataset.encrypted:
            # readers may serve samples from the part file while the rest arrives
            progress = FillProgress(
                live_path(d.parts_dir, shard),
                part=part,
                index_part=idx_part if index_url is not None else None,
                size=info.bytes,
                block=block_size(fetcher.part_size),
            )

        def fetch_index(report: FetchReport) -> None:
            if index_url is not None:
                given = source.index() if source is not None else None
                if given is None:
                    given = _fetch_index(fetcher, dataset, info, index_url, opts, report)
                index.append(given)
                if priority is not None and priority.need is not None and not dataset.encrypted:
                    try:
                        entries = parse_index(index[0], source=index_url)
                    except Exception:  # a bad index fails the reader, not the order
                        entries = None
                    if entries is not None:
                        priority.learn_index(entries, size=info.bytes, part_size=fetcher.part_size)
                if progress is not None:
                    _write_new(idx_part, index[0])
                    progress.index_ready()

        file_bytes = _FileBytes(fd, info.bytes)
        hasher = OrderedHasher(file_bytes)
        try:
            report = _fetch_to(
                fetcher, dataset, info, fd, opts, fetch_index, hasher, progress, priority, source
            )
        finally:
            file_bytes.close()
            os.close(fd)
        got = hasher.checksum(info.bytes)
        if got != info.checksum and dataset.in_place is not None:
            check_unit_bytes(b"", info, url=dataset.shard_url(info))  # the one-line refusal
        if got != info.checksum:
            raise CorruptShardError(
                f"shard {info.path} of dataset {dataset.url} arrived with checksum {got}, "
                f"the manifest of version {dataset.manifest.digest} says {info.checksum}: "
                "the object was replaced or corrupted (a dataset re-committed at this URL "
                "is a new version: a new loader reads it)"
            )
        if index and source is not None and source.index_from is not None:
            _check_index(part, index[0], dataset, info, source.index_from)
        if dataset.encrypted:
            _decrypt_in_place(part, dataset, info)
        make_private_dir(os.path.dirname(final))
        if index and progress is None:
            _write_new(idx_part, index[0])
        if verified is not None:
            verified(report)
        # under the space lock: a scan that sizes the cache (parts, then entries) must not
        # see one shard both as a part and as an entry, or a tight cache looks full
        with locked(space_lock(d.root)):
            if index:
                os.replace(idx_part, final + ".idx")
            os.replace(part, final)
        return report
    except OSError as exc:
        if exc.errno == errno.ENOSPC and not isinstance(exc, CacheFullError):
            raise CacheFullError(
                f"disk full (ENOSPC) under cache {d.root} while filling shard {info.path} "
                f"of {dataset.url} ({format_size(info.bytes)}): free space on that disk or "
                "lower the cache capacity below what it can hold; the cache is unchanged"
            ) from None
        raise
    finally:
        if progress is not None:
            progress.close()
        for p in (part, idx_part):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
