"""Sources: list a corpus into ``Item``s on the driver; read each back in a shard task.

Every source format is a ``SourceFormat`` (see ``format.py``) named in ``FORMATS``, the one
registry table: auto-detection, the CLI's ``--source-format`` choices and per-format
options, config validation, scanning and reading all come from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import (
    Item,
    Mapper,
    Record,
    Reject,
    RejectInfo,
    SourceScan,
    StorageContext,
    serial_map,
)
from .format import FolderFormat, Listing, SourceFormat, SourceOption, SourceReader
from .imagefolder import IMAGEFOLDER
from .lmdbsrc import LMDB
from .tables import CSV, JSONL, PARQUET
from .text import TEXT
from .tfrecord import TFRECORD
from .videofolder import VIDEOFOLDER
from .wds import WEBDATASET

__all__ = [
    "FORMATS",
    "Item",
    "Record",
    "Reject",
    "RejectInfo",
    "SourceFormat",
    "SourceOption",
    "SourceReader",
    "SourceScan",
    "StorageContext",
    "check_source_options",
    "detect_format",
    "format_options",
    "open_reader",
    "scan_source",
]

#: Every source format by name, in the order auto-detection tries them.
FORMATS: dict[str, SourceFormat] = {
    f.name: f
    for f in (LMDB, WEBDATASET, TFRECORD, TEXT, JSONL, CSV, PARQUET, IMAGEFOLDER, VIDEOFOLDER)
}


def detect_format(url: str, ctx: StorageContext) -> str:
    """The source format from what lies at ``url``; a clear error when nothing fits."""
    return _detect(url, Listing(url, ctx))


def _detect(url: str, listing: Listing) -> str:
    for fmt in FORMATS.values():
        if fmt.detect(url, listing):
            return fmt.name
    raise ValueError(
        f"cannot tell the format of {url}: no tar shards, TFRecords, tables, LMDB or images "
        "found; pass --source-format"
    )


def check_source_options(
    options: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, str]]:
    """``{format: {option: value}}`` checked against each format's own options; values
    equal to the default are dropped, so leaving an option out and giving its default name
    the same run. A bad format, option or value is a ``ValueError`` naming it."""
    out: dict[str, dict[str, str]] = {}
    for name, values in options.items():
        if name not in FORMATS:
            raise ValueError(
                f"source_options: no source format {name!r}; the formats are {list(FORMATS)}"
            )
        known = {o.name: o for o in FORMATS[name].options}
        for key, value in values.items():
            opt = known.get(key)
            if opt is None:
                raise ValueError(
                    f"source_options: format {name!r} has no option {key!r}"
                    + (f"; its options are {list(known)}" if known else "")
                )
            if opt.choices and value not in opt.choices:
                raise ValueError(f"{name}_{key} must be one of {opt.choices}, got {value!r}")
            if opt.check is not None:
                try:
                    opt.check(value)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{name}_{key}: {exc}") from None
            if value != opt.default:
                out.setdefault(name, {})[key] = value
    return dict(sorted(out.items()))


def format_options(fmt: str, options: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Every option of ``fmt``: the given values over the defaults."""
    given = options.get(fmt, {})
    return {o.name: given.get(o.name, o.default) for o in FORMATS[fmt].options}


def scan_source(
    url: str,
    fmt: str,
    ctx: StorageContext,
    *,
    fields: dict[str, str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    mapper: Mapper = serial_map,
) -> SourceScan:
    """List the source on the driver. ``mapper`` runs per-file scans (Ray in the runner);
    ``options`` are per-format options, ``{format: {option: value}}``."""
    listing = None
    if fmt == "auto":
        listing = Listing(url, ctx)
        fmt = _detect(url, listing)
    if fmt not in FORMATS:
        raise ValueError(f"unknown source format {fmt!r}")
    folder = FORMATS[fmt]
    if listing is not None and isinstance(folder, FolderFormat):  # one walk, not two
        return folder.scan_listed(url, ctx, listing)
    return FORMATS[fmt].scan(
        url,
        ctx,
        fields=fields or {},
        options=format_options(fmt, options or {}),
        mapper=mapper,
    )


def open_reader(fmt: str, shared: dict[str, Any]) -> SourceReader:
    """A reader for items of a ``fmt`` scan; close it when the task is done."""
    return FORMATS[fmt].open_reader(shared)
