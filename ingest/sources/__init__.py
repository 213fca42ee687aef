"""Sources: list a corpus into ``Item``s on the driver; read each back in a shard task."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from flashfeed import storage

from .base import (
    Item,
    Mapper,
    Record,
    Reject,
    RejectInfo,
    SourcePlan,
    StorageContext,
    list_sized,
    serial_map,
)
from .imagefolder import image_field, read_imagefolder_item, scan_imagefolder
from .lmdbsrc import read_lmdb_item, scan_lmdb
from .tables import TABLE_EXTS, read_table_item, scan_table
from .tfrecord import TFRECORD_SUFFIXES, read_tfrecord_item, scan_tfrecord
from .wds import TAR_SUFFIXES, read_wds_item, scan_wds

__all__ = [
    "Item",
    "Record",
    "Reject",
    "RejectInfo",
    "SourcePlan",
    "StorageContext",
    "detect_format",
    "reader_for",
    "scan_source",
]

Reader = Callable[[Item, StorageContext, dict[str, Any]], Record]

_READERS: dict[str, Reader] = {
    "imagefolder": read_imagefolder_item,
    "jsonl": read_table_item,
    "csv": read_table_item,
    "parquet": read_table_item,
    "webdataset": read_wds_item,
    "tfrecord": read_tfrecord_item,
    "lmdb": read_lmdb_item,
}


def _is_lmdb(url: str) -> bool:
    if not storage.is_local(url):
        return False
    path = os.path.abspath(os.path.expanduser(url[7:] if url.startswith("file://") else url))
    return os.path.isfile(os.path.join(path, "data.mdb")) or path.endswith((".mdb", ".lmdb"))


def detect_format(url: str, ctx: StorageContext) -> str:
    """The source format from what lies at ``url``; a clear error when nothing fits."""
    if _is_lmdb(url):
        return "lmdb"
    listed = [p.lower() for p, _ in list_sized(url, ctx)]
    if not listed:
        raise FileNotFoundError(f"source {url} does not exist (or holds no files)")
    if any(p.endswith(TAR_SUFFIXES) for p in listed):
        return "webdataset"
    if any(p.endswith(TFRECORD_SUFFIXES) for p in listed):
        return "tfrecord"
    for fmt, exts in TABLE_EXTS.items():
        if any(p.endswith(exts) for p in listed):
            return fmt
    if any(image_field(p) for p in listed):
        return "imagefolder"
    raise ValueError(
        f"cannot tell the format of {url}: no tar shards, TFRecords, tables, LMDB or images "
        "found; pass --source-format"
    )


def scan_source(
    url: str,
    fmt: str,
    ctx: StorageContext,
    *,
    fields: dict[str, str] | None = None,
    lmdb_decoder: str = "raw",
    mapper: Mapper = serial_map,
) -> SourcePlan:
    """List the source on the driver. ``mapper`` runs per-file scans (Ray in the runner)."""
    if fmt == "auto":
        fmt = detect_format(url, ctx)
    if fmt == "imagefolder":
        return scan_imagefolder(url, ctx)
    if fmt in TABLE_EXTS:
        return scan_table(url, fmt, ctx, fields or {})
    if fmt == "webdataset":
        return scan_wds(url, ctx, mapper)
    if fmt == "tfrecord":
        return scan_tfrecord(url, ctx, mapper, fields or {})
    if fmt == "lmdb":
        return scan_lmdb(url, ctx, lmdb_decoder)
    raise ValueError(f"unknown source format {fmt!r}")


def reader_for(fmt: str) -> Reader:
    return _READERS[fmt]
