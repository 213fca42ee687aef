"""One fill: fetch a shard into its reserved part file, verify it, rename it into place.

The shard becomes visible only by ``rename`` after its checksum matched, its index first;
any failure removes the part files, so a reader sees a complete, verified shard or none.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import xxhash

from flashfeed import crypto, storage
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError, FlashfeedError, StorageError
from flashfeed.manifest import ShardInfo
from flashfeed.units import format_size
from flashfeed.wdsindex import parse_index

from .directget import DirectObject, reader_for
from .errors import CacheFullError
from .layout import DatasetDir, make_private_dir
from .locks import locked
from .needorder import PartPriority
from .progress import FillProgress, live_path
from .ranged import FetchReport, RangedFetcher
from .space import space_lock

__all__ = ["OrderedHasher", "file_checksum", "fill_shard"]

Reserve = Callable[[int, str], int]


def file_checksum(path: str) -> str:
    """The manifest checksum (xxh3-128) of a local file, read through a memory map."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return storage.checksum(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return storage.checksum(memoryview(m))


# MADV_POPULATE_WRITE (Linux 5.14+): 23 on x86-64 and arm64; Python names it from 3.13
_LINUX_POPULATE = (
    23 if sys.platform == "linux" and os.uname().machine in ("x86_64", "aarch64") else None
)
_POPULATE: int | None = getattr(mmap, "MADV_POPULATE_WRITE", _LINUX_POPULATE)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class OrderedHasher:
    """The manifest checksum of parts that arrive out of order, hashed in order as soon as
    they are contiguous: the bytes are checked in transit, without reading the file back.
    Holds at most the parts that arrived ahead of a slower one."""

    def __init__(self) -> None:
        self._hash = xxhash.xxh3_128()
        self._next = 0
        self._waiting: dict[int, bytes | memoryview] = {}
        self._lock = threading.Lock()

    def add(self, offset: int, data: bytes | memoryview) -> None:
        with self._lock:
            self._waiting[offset] = data
            while self._next in self._waiting:
                chunk = self._waiting.pop(self._next)
                self._hash.update(chunk)
                self._next += len(chunk)

    def drop_pending(self) -> None:
        """Forget the parts waiting for a slower one (a fill that failed)."""
        with self._lock:
            self._waiting.clear()

    def checksum(self, size: int) -> str:
        with self._lock:
            if self._next != size or self._waiting:
                raise RuntimeError(f"hashed {self._next} of {size} bytes: a part is missing")
            return storage.CHECKSUM_PREFIX + self._hash.hexdigest()


def _fetch_to(
    fetcher: RangedFetcher,
    dataset: Dataset,
    info: ShardInfo,
    fd: int,
    opts: dict[str, Any] | None,
    meanwhile: Callable[[FetchReport], None] | None = None,
    hasher: OrderedHasher | None = None,
    progress: FillProgress | None = None,
    priority: PartPriority | None = None,
) -> FetchReport:
    url = dataset.shard_url(info)
    fs, path = storage.filesystem(url, opts)
    direct = _direct(url, fs, path, fetcher) if info.bytes > 0 else None
    mapped = _Mapped(fd, info.bytes) if direct is not None else None

    def fetch(start: int, end: int) -> bytes | memoryview:
        if mapped is not None and direct is not None:
            mapped.populate(start, end)
            part = mapped.view[start:end]
            direct.read_into(start, end, part)  # from the socket straight into the part file
            return part
        return fs.cat_file(path, start=start, end=end)

    def write(offset: int, data: bytes | memoryview) -> None:
        if mapped is None:
            _pwrite_all(fd, data, offset)
        if hasher is not None:
            hasher.add(offset, data)
        if progress is not None:
            progress.part_done(offset)

    try:
        return fetcher.fetch_into(fetch, info.bytes, write, meanwhile=meanwhile, priority=priority)
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
            f"could not fetch shard {info.path} of {dataset.url} ({url}): "
            f"{storage.redact(f'{type(exc).__name__}: {exc}')}"
        ) from None
    except Exception as exc:
        raise StorageError(
            f"could not fetch shard {info.path} of {dataset.url} ({url}): "
            f"{storage.redact(f'{type(exc).__name__}: {exc}')} (retries exhausted)"
        ) from None
    finally:
        if hasher is not None:
            hasher.drop_pending()
        if mapped is not None:
            mapped.close()


def _direct(url: str, fs: Any, path: str, fetcher: RangedFetcher) -> DirectObject | None:
    if not url.startswith(("s3://", "s3a://")):
        return None
    return reader_for(fs, path, connections=fetcher.limit.maximum)


class _Mapped:
    """The part file (reserved to its full size) mapped for writing: parts are read into
    it directly, and hashed from it."""

    def __init__(self, fd: int, size: int) -> None:
        self._map = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        self.view = memoryview(self._map)

    def populate(self, start: int, end: int) -> None:
        """Fault in the pages of ``[start, end)`` in one call before a part is read into
        them (MADV_POPULATE_WRITE), rather than one fault per page during the copy."""
        global _POPULATE
        if _POPULATE is None:
            return
        lo = start - start % mmap.PAGESIZE
        try:
            self._map.madvise(_POPULATE, lo, end - lo)
        except OSError:  # a kernel before 5.14: faults as usual
            _POPULATE = None

    def close(self) -> None:
        try:
            self.view.release()
            self._map.close()
        except BufferError:  # a part still referenced: unmapped when it is collected
            pass


def _fetch_index(
    fetcher: RangedFetcher,
    dataset: Dataset,
    info: ShardInfo,
    url: str,
    opts: dict[str, Any] | None,
    report: FetchReport,
) -> bytes:
    fs, path = storage.filesystem(url, opts)
    direct = _direct(url, fs, path, fetcher)
    read = direct.read if direct is not None else lambda: fs.cat_file(path)
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
) -> FetchReport:
    """Fetch shard ``shard`` into the cache; the caller holds its fill lock.

    With ``publish`` the parts that have arrived are announced (``progress.py``) so that
    readers can serve samples before the whole shard is there. ``priority`` ranks its
    parts among all parts in flight (``needorder.py``); it learns the index on arrival."""
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
                part_size=fetcher.part_size,
            )

        def fetch_index(report: FetchReport) -> None:
            if index_url is not None:
                index.append(_fetch_index(fetcher, dataset, info, index_url, opts, report))
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

        hasher = OrderedHasher()
        try:
            report = _fetch_to(
                fetcher, dataset, info, fd, opts, fetch_index, hasher, progress, priority
            )
        finally:
            os.close(fd)
        got = hasher.checksum(info.bytes)
        if got != info.checksum:
            raise CorruptShardError(
                f"shard {info.path} of dataset {dataset.url} arrived with checksum {got}, "
                f"the manifest says {info.checksum}: the object was replaced or corrupted"
            )
        if dataset.encrypted:
            _decrypt_in_place(part, dataset, info)
        make_private_dir(os.path.dirname(final))
        if index and progress is None:
            _write_new(idx_part, index[0])
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
