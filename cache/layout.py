"""Where everything lives in a cache directory. The files are the state: no journal.

::

    <root>/cache.json                 the cache's capacity, set by whoever created it (or
                                      changed by an explicit option), adopted by every opener
    <root>/stats.json                 persisted counters (see ``stats.py``)
    <root>/.locks/space.lock          held while sizing, evicting and reserving room
    <root>/<dataset key>/dataset.json the dataset URL
    <root>/<dataset key>/manifest.json a copy of its manifest (checksums for verify)
    <root>/<dataset key>/future.json  the last known read order (for status)
    <root>/<dataset key>/data/<shard path>[.idx]   complete, verified shards only
    <root>/<dataset key>/.parts/<i>.<pid>.<token>  fills in progress (or left by a crash)
    <root>/<dataset key>/.locks/<i>.fill|<i>.use   per-shard locks
    <root>/<dataset key>/.pins/<i>    present while shard i is pinned (``ShardCache.pin``)
    <root>/<dataset key>/.pins/<i>.warm  present while shard i is in a warmed share: a
                                      warm's reservation, released by a new warm of the
                                      dataset or by ``cache evict``

Directories are created 0700 and files 0600: cached data is as private as the credentials
that fetched it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import xxhash

from flashfeed.format.manifest import Manifest, commit_manifest, read_manifest
from flashfeed.runtime.files import atomic_write_json

from .errors import CachePermissionError

__all__ = [
    "CachedEntry",
    "DatasetDir",
    "check_private_root",
    "dataset_key",
    "list_dataset_dirs",
    "make_private_dir",
    "read_cache_record",
    "read_json",
    "record_path",
]


def make_private_dir(path: str) -> str:
    """``mkdir -p`` creating every missing directory with mode 0700."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    return path


def check_private_root(path: str) -> None:
    """Refuse a cache root that another user owns or that group/others may write into:
    they could read the cached data or plant files and links the cache would trust."""
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise CachePermissionError(
            f"cache directory {path} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}): use a cache directory of your own"
        )
    if st.st_mode & 0o022:
        raise CachePermissionError(
            f"cache directory {path} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): `chmod 700 {path}` or use another one"
        )


def read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return default


def record_path(root: str) -> str:
    """``<root>/cache.json``: what belongs to the cache itself (its capacity)."""
    return os.path.join(root, "cache.json")


def read_cache_record(root: str) -> dict[str, Any]:
    """The cache's own record; empty when absent or unreadable."""
    record = read_json(record_path(root))
    return record if isinstance(record, dict) else {}


def dataset_key(url: str, manifest: Manifest) -> str:
    """A directory name for one committed dataset: readable name + hash of URL and manifest.

    A dataset rewritten at the same URL gets a new key, so stale shards are never served.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "ds"
    digest = xxhash.xxh3_64_hexdigest(url.rstrip("/") + "\n" + manifest.digest)
    return f"{name}-{digest[:16]}"


@dataclass(frozen=True)
class CachedEntry:
    """One complete shard file in the cache."""

    dataset: str
    shard: int
    path: str
    size: int
    last_used: float
    pinned: bool


class DatasetDir:
    """The paths of one dataset inside a cache root."""

    def __init__(self, root: str, key: str) -> None:
        self.root = root
        self.key = key
        self.dir = os.path.join(root, key)
        self.data_dir = os.path.join(self.dir, "data")
        self.parts_dir = os.path.join(self.dir, ".parts")
        self.locks_dir = os.path.join(self.dir, ".locks")
        self.pins_dir = os.path.join(self.dir, ".pins")
        self.manifest_path = os.path.join(self.dir, "manifest.json")
        self.meta_path = os.path.join(self.dir, "dataset.json")
        self.future_path = os.path.join(self.dir, "future.json")
        self._manifest: Manifest | None = None
        self._by_path: dict[str, int] | None = None
        self._sizes: dict[str, tuple[int, int]] = {}  # path -> (inode, bytes): held_bytes

    def create(self, url: str, manifest: Manifest) -> None:
        for d in (self.dir, self.data_dir, self.parts_dir, self.locks_dir, self.pins_dir):
            make_private_dir(d)
        if not os.path.exists(self.manifest_path):
            self._keep_manifest(manifest)
        if not os.path.exists(self.meta_path):
            atomic_write_json(self.meta_path, {"url": url.rstrip("/"), "name": manifest.name})
        self._manifest = manifest

    def _keep_manifest(self, manifest: Manifest) -> None:
        """A private copy of the manifest as the dataset has it (header and columnar table):
        written in a private scratch directory, made 0600, moved in with the header last."""
        scratch = tempfile.mkdtemp(prefix=".manifest-", dir=self.dir)
        try:
            commit_manifest(scratch, manifest)
            names = sorted(os.listdir(scratch), key=lambda n: n == "manifest.json")
            for name in names:
                os.chmod(os.path.join(scratch, name), 0o600)
            for name in names:
                os.replace(os.path.join(scratch, name), os.path.join(self.dir, name))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @property
    def url(self) -> str:
        return str((read_json(self.meta_path) or {}).get("url", self.key))

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = read_manifest(self.dir)
        return self._manifest

    def shard_path(self, shard: int) -> str:
        return os.path.join(self.data_dir, self.manifest.shards[shard].path)

    def fill_lock(self, shard: int) -> str:
        return os.path.join(self.locks_dir, f"{shard}.fill")

    def use_lock(self, shard: int) -> str:
        return os.path.join(self.locks_dir, f"{shard}.use")

    def pin_path(self, shard: int) -> str:
        return os.path.join(self.pins_dir, str(shard))

    def warm_pin_path(self, shard: int) -> str:
        return os.path.join(self.pins_dir, f"{shard}.warm")

    def pinned(self, *, warm_only: bool = False) -> set[int]:
        """The shards pinned now: by ``ShardCache.pin`` or by a warm (only those with
        ``warm_only``)."""
        try:
            names = os.listdir(self.pins_dir)
        except FileNotFoundError:
            return set()
        out = set()
        for n in names:
            head, _, kind = n.partition(".")
            if head.isdigit() and (kind == "warm" or (not kind and not warm_only)):
                out.add(int(head))
        return out

    def new_part(self, shard: int, what: str = "data") -> str:
        return os.path.join(self.parts_dir, f"{shard}.{what}.{os.getpid()}.{secrets.token_hex(4)}")

    def parts(self) -> list[tuple[int, str]]:
        """``(shard, path)`` of every part file: fills in progress or left by dead ones."""
        try:
            names = os.listdir(self.parts_dir)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            head = name.split(".", 1)[0]
            if head.isdigit():
                out.append((int(head), os.path.join(self.parts_dir, name)))
        return out

    def orphan_indexes(self) -> list[tuple[int, str]]:
        """``(shard, path)`` of every index whose shard file is absent: what a process killed
        between the two renames of a fill (index first) or the two unlinks of an eviction
        (shard first) leaves. Never visible as an entry, but it takes room."""
        by_path = self._shard_numbers()
        names = {rel: full for rel, full, _ in self._files()}
        return [
            (i, full)
            for rel, full in names.items()
            if rel.endswith(".idx")
            and (i := by_path.get(rel[: -len(".idx")])) is not None
            and rel[: -len(".idx")] not in names
        ]

    def _files(self) -> Iterator[tuple[str, str, int]]:
        """``(path under the data folder, "/"-separated; full path; inode)`` of every file."""
        stack = [(self.data_dir, "")]
        while stack:
            folder, prefix = stack.pop()
            try:
                listing = os.scandir(folder)
            except FileNotFoundError:
                continue
            with listing:
                for e in listing:
                    if not e.is_dir():
                        yield prefix + e.name, e.path, e.inode()
                    elif not e.is_symlink():  # as os.walk: a linked folder is not entered
                        stack.append((e.path, f"{prefix}{e.name}/"))

    def _shard_numbers(self) -> dict[str, int]:
        if self._by_path is None:
            self._by_path = {s.path: i for i, s in enumerate(self.manifest.shards)}
        return self._by_path

    def entries(self) -> list[CachedEntry]:
        """Every complete shard file present now (a walk of what is cached, not of the
        manifest: the cost follows the cached files, not the dataset's size)."""
        by_path = self._shard_numbers()
        pinned = self.pinned()
        files: dict[str, tuple[str, os.stat_result]] = {}
        for rel, full, _ in self._files():
            try:
                files[rel] = (full, os.stat(full))
            except FileNotFoundError:
                pass
        out = []
        for rel, (full, st) in files.items():
            i = by_path.get(rel)
            if i is None:
                continue  # an index, or a file that is not a shard of this dataset
            idx = files.get(rel + ".idx")
            size = st.st_size + (idx[1].st_size if idx is not None else 0)
            out.append(CachedEntry(self.key, i, full, size, st.st_mtime, i in pinned))
        return sorted(out, key=lambda e: e.shard)

    def held_shards(self) -> list[int]:
        """The numbers of the shards with a complete file here, by a listing (no ``stat``):
        what the cluster tier announces, rebuilt often."""
        by_path = self._shard_numbers()
        return sorted(i for rel, _, _ in self._files() if (i := by_path.get(rel)) is not None)

    def held_bytes(self) -> int:
        """The bytes of the complete entries, counted as ``entries()`` counts them, without
        a ``stat`` per entry: a cached file is renamed in whole and removed whole, never
        resized, so its size is remembered by path and inode between calls, and a call
        lists the folders and stats only the files it has not seen. What a fill's space
        check runs; with thousands of shards cached, a stat of each at every fill cost
        more CPU than the fill's own bytes."""
        by_path = self._shard_numbers()
        known, sizes = self._sizes, {}
        for rel, full, inode in self._files():
            seen = known.get(rel)
            if seen is None or seen[0] != inode:
                try:
                    seen = (inode, os.stat(full).st_size)
                except FileNotFoundError:
                    continue
            sizes[rel] = seen
        self._sizes = sizes
        return sum(
            size + sizes.get(rel + ".idx", (0, 0))[1]
            for rel, (_, size) in sizes.items()
            if rel in by_path
        )

    def part_bytes(self) -> int:
        """Bytes of fills in progress (their progress files are bookkeeping, not data)."""
        total = 0
        for _, path in self.parts():
            if ".live" in os.path.basename(path):
                continue
            try:
                total += os.stat(path).st_size
            except FileNotFoundError:
                pass
        return total


def list_dataset_dirs(root: str) -> list[DatasetDir]:
    """Every dataset directory with a manifest copy under ``root``."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [
        DatasetDir(root, n) for n in names if os.path.isfile(os.path.join(root, n, "manifest.json"))
    ]
