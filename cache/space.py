"""Room for fills: size what the cache holds, evict, reserve, and sweep dead fills.

All of it runs under one node-wide lock (``<root>/.locks/space.lock``) so that two processes
never both decide the same free bytes are theirs. A fill's part file is allocated to its
full size while the lock is held, so it counts against the capacity until it is renamed or
removed. Part files whose fill lock is free belong to dead fills and are removed.

The capacity belongs to the cache (``<root>/cache.json``): ``settle_capacity`` decides it once
per opening process under the same lock, so every process of a node bounds the same number.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import cast

from flashfeed.runtime.files import atomic_write_json
from flashfeed.units import format_size

from .errors import CacheFullError, CacheOverCapacityError
from .layout import (
    CachedEntry,
    DatasetDir,
    list_dataset_dirs,
    make_private_dir,
    read_cache_record,
    record_path,
)
from .locks import FileLock, locked
from .policy import Candidate, eviction_order
from .stats import Counters

__all__ = [
    "DEFAULT_FRACTION",
    "SpaceManager",
    "default_capacity",
    "recorded_capacity",
    "remove_entry",
    "scan",
    "settle_capacity",
    "space_lock",
]

log = logging.getLogger("flashfeed.cache")

NextUse = Callable[[str, int], float]

DEFAULT_FRACTION = 0.8
"""A new cache without a given capacity may use this share of the room it has."""


def space_lock(root: str) -> str:
    """The node-wide lock held while sizing, evicting, reserving and settling the capacity."""
    return os.path.join(make_private_dir(os.path.join(root, ".locks")), "space.lock")


def scan(
    root: str, *, sweep: bool = True, known: dict[str, DatasetDir] | None = None
) -> tuple[list[tuple[DatasetDir, CachedEntry]], int]:
    """Every complete entry, and the bytes used (entries + part files of fills).

    ``sweep`` first removes the part files of dead fills (a lock tried per part file);
    without it they still count as used. ``known`` keeps the dataset directories between
    scans (keyed by name), so each dataset's manifest is read once, not at every scan."""
    entries = []
    used = 0
    for d in _dataset_dirs(root, known):
        if sweep:
            sweep_dead_parts(d)
        used += d.part_bytes()
        for e in d.entries():
            entries.append((d, e))
            used += e.size
    return entries, used


def _dataset_dirs(root: str, known: dict[str, DatasetDir] | None) -> list[DatasetDir]:
    """The dataset directories under ``root``, the ones in ``known`` reused (and new ones
    added to it), so that what they remember (manifest, file sizes) outlives one scan."""
    dirs = list_dataset_dirs(root)
    return dirs if known is None else [known.setdefault(d.key, d) for d in dirs]


def recorded_capacity(root: str) -> int | None:
    """The capacity recorded in the cache, or None for a cache that has none yet."""
    value = read_cache_record(root).get("capacity")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def default_capacity(root: str, held: int) -> int:
    """``DEFAULT_FRACTION`` of the room the cache has: the disk's free space plus the bytes
    it already holds (a warmed cache's own shards are room it may keep, not room taken)."""
    room = shutil.disk_usage(root).free + held
    value = int(room * DEFAULT_FRACTION)
    if value <= 0:
        raise ValueError(
            f"no room for a cache in {root} ({format_size(room)} free and held): "
            "free some space or give the capacity explicitly"
        )
    return value


def settle_capacity(root: str, given: int | None) -> int:
    """The capacity of the cache in ``root``, for a process opening it now.

    ``given`` None: the recorded capacity, or for a cache without one the default, which is
    then recorded. A given capacity is honoured and recorded; when it differs from the
    recorded one the change is logged, naming both (a lower one evicts on the next fills).
    Settled under the space lock, so processes opening a new cache at once agree.
    """
    with locked(space_lock(root)):
        record = read_cache_record(root)
        recorded = recorded_capacity(root)
        if given is None and recorded is not None:
            return recorded
        if given is not None and given == recorded:
            return given
        held = scan(root)[1]
        if given is None:
            value = default_capacity(root, held)
            log.info(
                "cache %s: no capacity recorded or given; using %s (%.0f%% of the free space "
                "plus the %s it holds)",
                root,
                format_size(value),
                DEFAULT_FRACTION * 100,
                format_size(held),
            )
        else:
            value = given
            if recorded is not None:
                lower = value < recorded
                log.log(
                    logging.WARNING if lower else logging.INFO,
                    "cache %s: capacity changed from %s (recorded) to %s (given)%s",
                    root,
                    format_size(recorded),
                    format_size(value),
                    f"; it holds {format_size(held)}, so the next fills evict"
                    if held > value
                    else "",
                )
        atomic_write_json(record_path(root), {**record, "capacity": value})
        return value


def remove_entry(d: DatasetDir, shard: int) -> int | None:
    """Delete a cached shard (and its index) unless a fill holds it or a process uses it.

    Returns the bytes freed, or None when it was busy. The shard file goes first, so a
    present shard always has its index beside it.
    """
    fill = FileLock(d.fill_lock(shard))
    if not fill.acquire(blocking=False):
        return None
    try:
        use = FileLock(d.use_lock(shard))
        if not use.acquire(blocking=False):
            return None
        try:
            freed = 0
            path = d.shard_path(shard)
            for p in (path, path + ".idx"):
                try:
                    freed += os.stat(p).st_size
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            return freed
        finally:
            use.release()
    finally:
        fill.release()


def sweep_dead_parts(d: DatasetDir) -> int:
    """Remove part files left by fills whose process died, and indexes left without their
    shard by a fill or an eviction killed halfway; returns how many. Each under the shard's
    fill lock, which a live fill holds from its first byte to its last rename."""
    removed = 0
    orphans = d.orphan_indexes()
    orphan_paths = {path for _, path in orphans}
    for shard, path in d.parts() + orphans:
        lock = FileLock(d.fill_lock(shard))
        if not lock.acquire(blocking=False):
            continue  # a live fill of this shard: its part files are in use
        try:
            if path in orphan_paths and os.path.exists(path.removesuffix(".idx")):
                continue  # its fill ended between the listing and the lock
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
        finally:
            lock.release()
    return removed


class SpaceManager:
    """Keeps the bytes in ``root`` within ``capacity``."""

    def __init__(
        self,
        root: str,
        *,
        capacity: int,
        counters: Counters,
        next_use: NextUse,
        timeout: float,
    ) -> None:
        self.root = root
        self.capacity = capacity
        self.counters = counters
        self.next_use = next_use
        self.timeout = timeout
        self.lock_path = space_lock(root)
        self._known: dict[str, DatasetDir] = {}

    def scan(self, *, sweep: bool = True) -> tuple[list[tuple[DatasetDir, CachedEntry]], int]:
        """Every complete entry, and the bytes used (entries + part files of fills)."""
        return scan(self.root, sweep=sweep, known=self._known)

    def held(self) -> int:
        """The bytes used, as ``scan`` counts them (parts of dead fills included), for the
        price of listing the cache's folders: ``DatasetDir.held_bytes``."""
        return sum(d.held_bytes() + d.part_bytes() for d in _dataset_dirs(self.root, self._known))

    def used_bytes(self) -> int:
        with locked(self.lock_path):
            return self.scan()[1]

    def reserve(
        self, d: DatasetDir, shard: int, need: int, part: str, *, speculative: bool = False
    ) -> int:
        """Create ``part`` allocated to ``need`` bytes, evicting first if needed; its fd.

        A ``speculative`` fill (fetch ahead, warm) only evicts shards needed later than the one
        it fetches, and fails at once rather than wait for room.
        """
        deadline = time.monotonic() + self.timeout
        later_than = self.next_use(d.key, shard) if speculative else None
        if later_than == math.inf:
            later_than = None  # not in a known order: plain LRU
        while True:
            with locked(self.lock_path):
                # when it fits, listing the folders is enough; only a shortage pays for a
                # full scan (a stat per entry) that sweeps the parts left by dead fills
                if self.held() + need <= self.capacity:
                    return _allocate(part, need)
                entries, used = self.scan()
                if used + need > self.capacity:
                    amount = used + need - self.capacity
                    used -= self._evict(entries, amount, (d.key, shard), later_than)
                if used + need <= self.capacity:
                    return _allocate(part, need)
                pinned = sum(e.pinned for _, e in entries)
                held = _pinned_by(entries)
            if sum(held.values()) + need > self.capacity:
                raise CacheOverCapacityError(_over_capacity(self, d, shard, need, held))
            if speculative:
                raise CacheFullError(
                    f"no room in cache {self.root} to fetch ahead shard {shard} of {d.url}: "
                    f"every cached shard is needed sooner, pinned or in use"
                )
            if time.monotonic() >= deadline:
                raise CacheFullError(
                    f"no room in cache {self.root} for shard {shard} of {d.url} "
                    f"({format_size(need)}): {format_size(used)} of {format_size(self.capacity)} "
                    f"held by {len(entries)} shards, {pinned} pinned, the rest in use or being "
                    f"filled; unpin shards, close readers or raise the capacity"
                )
            time.sleep(0.1)

    def _evict(
        self,
        entries: list[tuple[DatasetDir, CachedEntry]],
        amount: int,
        exclude: tuple,
        later_than: float | None = None,
    ) -> int:
        """Evict in policy order until ``amount`` bytes are free; only shards whose next use
        is after ``later_than`` when given (and none if they could not make enough room)."""
        dirs = {d.key: d for d, _ in entries}
        candidates = [
            Candidate(
                key=(e.dataset, e.shard),
                size=e.size,
                last_used=e.last_used,
                next_use=self.next_use(e.dataset, e.shard),
            )
            for _, e in entries
            if not e.pinned and (e.dataset, e.shard) != exclude
        ]
        if later_than is not None:
            candidates = [c for c in candidates if c.next_use > later_than]
            if sum(c.size for c in candidates) < amount:
                return 0
        freed = 0
        for c in eviction_order(candidates):
            if freed >= amount:
                break
            key, shard = cast(tuple[str, int], c.key)
            got = remove_entry(dirs[key], shard)
            if got is not None:
                freed += got
                self.counters.add(evictions=1, evicted_bytes=got)
        return freed

    def evict_all(self, dirs: list[DatasetDir]) -> tuple[int, int, int]:
        """Evict every unpinned entry not in use: ``(evicted, bytes, kept)``."""
        evicted = freed = kept = 0
        with locked(self.lock_path):
            for d in dirs:
                sweep_dead_parts(d)
                for e in d.entries():
                    got = None if e.pinned else remove_entry(d, e.shard)
                    if got is None:
                        kept += 1
                    else:
                        evicted += 1
                        freed += got
        if evicted:
            self.counters.add(evictions=evicted, evicted_bytes=freed)
        return evicted, freed, kept


def _pinned_by(entries: list[tuple[DatasetDir, CachedEntry]]) -> dict[str, int]:
    """Pinned bytes per dataset URL."""
    out: dict[str, int] = {}
    for d, e in entries:
        if e.pinned:
            out[d.url] = out.get(d.url, 0) + e.size
    return out


def _over_capacity(
    space: SpaceManager, d: DatasetDir, shard: int, need: int, held: dict[str, int]
) -> str:
    pins = ", ".join(f"{format_size(n)} of {url}" for url, n in sorted(held.items()))
    return (
        f"over capacity: shard {shard} of {d.url} ({format_size(need)}) cannot fit in cache "
        f"{space.root} (capacity {format_size(space.capacity)}) beside the pinned shards "
        f"({pins}; warmed shares are pinned until `flashfeed cache evict {space.root} "
        "--dataset URL` or a new warm): raise the capacity or release a warm"
    )


def _allocate(part: str, size: int) -> int:
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass
        raise
    return fd
