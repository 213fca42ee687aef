"""``flashfeed verify``: check every shard of a dataset against its manifest, in parallel.

Each shard is streamed once (constant memory per worker) to compare its size and xxh3-128
checksum with the manifest; a tar shard's ``.idx`` must also parse and agree with it.
Every bad shard is reported, not only the first.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import xxhash

from flashfeed.format.manifest import ShardInfo

from . import storage
from .dataset import Dataset
from .errors import CorruptShardError

__all__ = ["ShardProblem", "VerifyReport", "stream_checksum", "verify_dataset"]

_BLOCK = 8 << 20


@dataclass(frozen=True)
class ShardProblem:
    """One bad shard: its path in the manifest and what is wrong with it."""

    path: str
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    url: str
    shards: int
    bytes: int
    problems: tuple[ShardProblem, ...]
    format_version: int = 0  # of the manifest the shards were checked against

    @property
    def ok(self) -> bool:
        return not self.problems


def stream_checksum(
    url: str, *, storage_options: dict[str, Any] | None = None, block_size: int = _BLOCK
) -> tuple[int, str]:
    """``(size, checksum)`` of an object, read in blocks; retried as one storage operation."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    fs, path = storage.filesystem(url, storage_options)

    def op() -> tuple[int, str]:
        h = xxhash.xxh3_128()
        n = 0
        with fs.open(path, "rb", block_size=block_size) as f:
            while chunk := f.read(block_size):
                h.update(chunk)
                n += len(chunk)
        return n, storage.CHECKSUM_PREFIX + h.hexdigest()

    return storage.call(op, url=url, what="read", storage_options=storage_options)


def verify_dataset(
    dataset: str | Dataset,
    *,
    workers: int = 8,
    check_index: bool = True,
    storage_options: dict[str, Any] | None = None,
    on_done: Callable[[ShardInfo], None] | None = None,
) -> VerifyReport:
    """Check all shards; ``on_done(shard)`` is called as each finishes (progress bars).

    Storage failures that are not about one shard (server down, wrong credentials) raise
    ``StorageError``; shard problems are collected in the report.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ds = (
        dataset
        if isinstance(dataset, Dataset)
        else Dataset.open(dataset, storage_options=storage_options)
    )
    found: list[tuple[int, ShardProblem]] = []
    n = ds.num_shards
    if n:
        # a bounded window of shards in flight: a million-shard dataset never holds a
        # million futures (or ShardInfo objects) at once
        window = max(workers * 4, 1)
        with ThreadPoolExecutor(max_workers=min(workers, n)) as pool:
            pending: dict[Future[str | None], tuple[int, ShardInfo]] = {}
            for i, info in enumerate(ds.shards):
                pending[pool.submit(_check_shard, ds, info, check_index)] = (i, info)
                if len(pending) >= window:
                    _collect(pending, found, on_done, FIRST_COMPLETED)
            while pending:
                _collect(pending, found, on_done, FIRST_COMPLETED)
    found.sort(key=lambda p: p[0])
    return VerifyReport(
        url=ds.url,
        shards=n,
        bytes=ds.manifest.num_bytes,
        problems=tuple(p for _, p in found),
        format_version=ds.manifest.format_version,
    )


def _collect(
    pending: dict[Future[str | None], tuple[int, ShardInfo]],
    found: list[tuple[int, ShardProblem]],
    on_done: Callable[[ShardInfo], None] | None,
    how: str,
) -> None:
    done, _ = wait(pending, return_when=how)
    for fut in done:
        i, info = pending.pop(fut)
        reason = fut.result()
        if reason:
            found.append((i, ShardProblem(info.path, reason)))
        if on_done is not None:
            on_done(info)


def _check_shard(ds: Dataset, info: ShardInfo, check_index: bool) -> str | None:
    url = ds.shard_url(info)
    if ds.in_place is not None:  # a unit of a file indexed in place: its range, checked
        try:
            ds.read_shard(info)
        except CorruptShardError as exc:
            return str(exc)
        return None
    try:
        n, digest = stream_checksum(url, storage_options=ds.storage_options)
    except FileNotFoundError:
        return f"missing: {url} does not exist"
    if n != info.bytes:
        return f"size is {n} bytes, the manifest says {info.bytes} (truncated or replaced)"
    if digest != info.checksum:
        return f"checksum mismatch: manifest {info.checksum}, read {digest} (corrupt or replaced)"
    if check_index and info.index and ds.manifest.shard_format == "webdataset":
        try:
            index = ds.read_index(info)
        except CorruptShardError as exc:
            return f"index: {exc}"
        if len(index) != info.samples:
            return f"index {info.index} lists {len(index)} samples, the manifest {info.samples}"
        if index and max(s.end for s in index) > info.bytes:
            return f"index {info.index} points past the end of the shard"
    return None
