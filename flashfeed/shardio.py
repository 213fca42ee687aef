"""Write one finished shard (tar + ``.idx``, or Arrow) to a dataset prefix.

The shard is built in memory or in a local temporary file, checksummed, then uploaded with an
atomic write per object; the manifest, written last by the caller, is what commits it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from flashfeed.format.arrowshard import BATCH_BYTES, write_arrow
from flashfeed.format.manifest import ShardInfo
from flashfeed.format.tarshard import Sample, TarShardWriter

from . import storage

__all__ = ["shard_name", "tar_shard_bytes", "write_arrow_shard", "write_tar_shard"]


def shard_name(i: int, ext: str) -> str:
    """``shards/000042.tar``: the path of shard ``i`` inside a dataset prefix."""
    if i < 0:
        raise ValueError(f"shard number must be >= 0, got {i}")
    return f"shards/{i:06d}.{ext}"


def tar_shard_bytes(samples: Iterable[Sample]) -> tuple[bytes, str, int]:
    """``(tar_bytes, index_text, num_samples)`` for samples, deterministic for equal input."""
    buf = io.BytesIO()
    with TarShardWriter(buf) as w:
        for key, fields in samples:
            w.write(key, fields)
    if w.num_samples == 0:
        raise ValueError("an empty shard cannot be written")
    return buf.getvalue(), w.index_text(), w.num_samples


def write_tar_shard(
    prefix: str,
    path: str,
    samples: Iterable[Sample],
    *,
    storage_options: dict[str, Any] | None = None,
) -> ShardInfo:
    """Write ``<prefix>/<path>`` and ``<prefix>/<path>.idx``; return the manifest entry."""
    data, index, n = tar_shard_bytes(samples)
    index_path = path + ".idx"
    storage.write_bytes(
        storage.join(prefix, index_path), index.encode(), storage_options=storage_options
    )
    storage.write_bytes(storage.join(prefix, path), data, storage_options=storage_options)
    return ShardInfo(
        path=path, samples=n, bytes=len(data), checksum=storage.checksum(data), index=index_path
    )


def write_arrow_shard(
    prefix: str,
    path: str,
    table: pa.Table,
    *,
    storage_options: dict[str, Any] | None = None,
    batch_bytes: int | None = BATCH_BYTES,
) -> ShardInfo:
    """Write ``<prefix>/<path>`` as an Arrow IPC file (record batches of about
    ``batch_bytes``, ``write_arrow``); return the manifest entry."""
    data = write_arrow(table, batch_bytes=batch_bytes)
    storage.write_bytes(storage.join(prefix, path), data, storage_options=storage_options)
    return ShardInfo(
        path=path, samples=table.num_rows, bytes=len(data), checksum=storage.checksum(data)
    )
