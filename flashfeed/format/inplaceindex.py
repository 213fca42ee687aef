"""``flashfeed index`` over Parquet or JSONL files: a manifest of their units, no copy.

Each file is read once, front to back, to checksum its units (a Parquet row group's
bytes, a JSONL block's whole lines); its footer and its place in the listing (size, ETag)
are recorded in the files table (``flashfeed.format.inplace``). Nothing is written beside the data
unless the manifest goes there: ``manifest_prefix`` puts it under another prefix when the
source is read-only.
"""

from __future__ import annotations

import gzip
import json
import posixpath
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.errors import DatasetExistsError
from flashfeed.format.inplace import FILES_PREFIX, IN_PLACE, InPlaceError, files_table, unit_path
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest, manifest_url
from flashfeed.format.shardtable import ShardTable

__all__ = [
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "InPlaceReport",
    "find_in_place_files",
    "index_in_place",
]

PARQUET_SUFFIXES = (".parquet",)
#: suffix -> codec; a compressed file is one unit
JSONL_SUFFIXES = {".jsonl": "", ".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}
#: bytes read per request while a file is checksummed
READ_BLOCK = 64 << 20
#: a JSONL block's target size: whole lines up to the first newline past it
DEFAULT_BLOCK_BYTES = 16 << 20
_TAIL = 64 << 10  # the first read of a Parquet footer: the last 64 KiB


@dataclass
class _Scanned:
    """One file's units and what the files table records of it."""

    file: str
    size: int
    etag: str | None
    codec: str = ""
    footer: bytes | None = None
    schema: Any = None  # pa.Schema (parquet) or a list of keys (jsonl)
    units: list[ShardInfo] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class InPlaceReport:
    """What ``index_in_place`` committed: where, the manifest, files and requests made."""

    url: str
    manifest_url: str
    manifest: Manifest
    files: int
    requests: int


def _kind(rel: str) -> tuple[str, str] | None:
    low = rel.lower()
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet", ""
    for suffix, codec in JSONL_SUFFIXES.items():
        if low.endswith(suffix):
            return "jsonl", codec
    return None


def find_in_place_files(
    prefix: str, storage_options: dict[str, Any] | None = None
) -> list[tuple[str, int, str | None]]:
    """``(relative path, size, etag)`` of every Parquet or JSONL file under ``prefix``, from
    one listing; hidden files and flashfeed's own manifest files left out."""
    fs, base = storage.filesystem(prefix, storage_options)
    base = base.rstrip("/")

    def op() -> dict[str, Any]:
        if not storage.is_local(prefix):
            fs.invalidate_cache()
        return fs.find(base, detail=True) if fs.exists(base) else {}

    found = storage.call(op, url=prefix, what="list", storage_options=storage_options)
    out = []
    for path, info in sorted(found.items()):
        if not path.startswith(base + "/") or info.get("type") == "directory":
            continue
        rel = path[len(base) + 1 :]
        if any(p.startswith(".") for p in rel.split("/")) or _kind(rel) is None:
            continue
        etag = info.get("ETag") or info.get("etag")
        out.append((rel, int(info["size"]), str(etag).strip('"') if etag else None))
    return out


def index_in_place(
    prefix: str,
    *,
    manifest_prefix: str | None = None,
    name: str | None = None,
    overwrite: bool = False,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    storage_options: dict[str, Any] | None = None,
    on_file: Callable[[str], None] | None = None,
) -> InPlaceReport:
    """Index every Parquet (or every JSONL) file under ``prefix`` and commit a manifest at
    ``manifest_prefix`` (default: ``prefix`` itself). Raises ``InPlaceError`` (one line,
    nothing written) for a corrupt footer, a schema that differs between files, a folder
    mixing Parquet and JSONL, or one without either."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
        raise ValueError(f"block_bytes must be an integer >= 1, got {block_bytes!r}")
    prefix = prefix.rstrip("/")
    dest = (manifest_prefix or prefix).rstrip("/")
    if not overwrite and storage.exists(manifest_url(dest), storage_options=storage_options):
        raise DatasetExistsError(
            f"{dest} already holds a committed dataset ({manifest_url(dest)}); "
            "pass --overwrite (overwrite=True) to re-index it"
        )
    listed = find_in_place_files(prefix, storage_options)
    if not listed:
        raise InPlaceError(
            f"no *.parquet, *.jsonl, *.jsonl.gz or *.jsonl.zst files under {prefix} "
            "(sub-folders are searched too)"
        )
    kinds = {_kind(rel)[0] for rel, _, _ in listed}  # type: ignore[index]
    if len(kinds) > 1:
        raise InPlaceError(
            f"{prefix} mixes Parquet and JSONL files: index each kind under its own prefix"
        )
    fmt = kinds.pop()
    requests = [1]  # the listing

    def one(item: tuple[str, int, str | None]) -> _Scanned:
        rel, size, etag = item
        url = storage.join(prefix, rel)
        codec = _kind(rel)[1]  # type: ignore[index]
        if fmt == "parquet":
            got = _scan_parquet(url, rel, size, etag, storage_options, requests)
        else:
            got = _scan_jsonl(url, rel, size, etag, codec, block_bytes, storage_options, requests)
        if on_file is not None:
            on_file(rel)
        return got

    with ThreadPoolExecutor(max_workers=min(workers, len(listed))) as pool:
        scanned = list(pool.map(one, listed))
    schema = _common_schema(fmt, scanned)
    units = [u for s in scanned for u in s.units]
    if not units:
        raise InPlaceError(f"every file under {prefix} is empty")
    data = files_table(
        [s.file for s in scanned], [s.size for s in scanned], [s.etag for s in scanned],
        [s.codec for s in scanned], [s.footer for s in scanned], [s.offsets for s in scanned],
    )  # fmt: skip
    digest = storage.checksum(data)
    table_name = f"{FILES_PREFIX}{digest[len(storage.CHECKSUM_PREFIX) :][:16]}.arrow"
    storage.write_bytes(storage.join(dest, table_name), data, storage_options=storage_options)
    requests[0] += 1
    manifest = Manifest(
        name=name or posixpath.basename(prefix) or "dataset",
        shard_format=fmt,
        schema=schema,
        shards=ShardTable.from_infos(units),
        source={
            "kind": "in-place",
            "root": "." if dest == prefix else prefix,
            "files": {"path": table_name, "bytes": len(data), "checksum": digest},
            "indexed_by": "flashfeed index",
        },
        requires=(IN_PLACE,),
    )
    url = commit_manifest(dest, manifest, overwrite=overwrite, storage_options=storage_options)
    requests[0] += 2
    return InPlaceReport(dest, url, manifest, len(scanned), requests[0])


def _read(url: str, lo: int, hi: int, opts: dict[str, Any] | None, requests: list[int]) -> bytes:
    requests[0] += 1  # an int add under the GIL: the counter is shared by the pool's threads
    return storage.read_bytes(url, start=lo, end=hi, storage_options=opts)


def _stream_hash(
    url: str,
    ranges: list[tuple[int, int]],
    size: int,
    opts: dict[str, Any] | None,
    requests: list[int],
) -> list[str]:
    """The xxh3-128 of each of ``ranges`` (sorted, disjoint), reading the file front to
    back in ``READ_BLOCK`` requests."""
    hashes = [xxhash.xxh3_128() for _ in ranges]
    r = 0
    for lo in range(0, size, READ_BLOCK):
        hi = min(lo + READ_BLOCK, size)
        block = memoryview(_read(url, lo, hi, opts, requests))
        if len(block) != hi - lo:
            raise InPlaceError(f"{url}: changed while it was indexed (short read at {lo})")
        while r < len(ranges) and ranges[r][0] < hi:
            a, b = ranges[r]
            hashes[r].update(block[max(a, lo) - lo : min(b, hi) - lo])
            if b > hi:
                break
            r += 1
    return [storage.CHECKSUM_PREFIX + h.hexdigest() for h in hashes]


def _scan_parquet(
    url: str,
    rel: str,
    size: int,
    etag: str | None,
    opts: dict[str, Any] | None,
    requests: list[int],
) -> _Scanned:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if size < 12:
        raise InPlaceError(f"{url}: not a Parquet file ({size} bytes, too short for a footer)")
    tail = _read(url, max(0, size - _TAIL), size, opts, requests)
    flen = struct.unpack("<I", tail[-8:-4])[0] if len(tail) >= 8 else 0
    if tail[-4:] != b"PAR1" or flen + 8 > size:
        raise InPlaceError(f"{url}: not a Parquet file, or its footer is corrupt (no PAR1 end)")
    if flen + 8 > len(tail):
        tail = _read(url, size - flen - 8, size, opts, requests)
    footer = bytes(tail[-8 - flen : -8])
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail[-8:]))
        schema = md.schema.to_arrow_schema().remove_metadata()
    except (pa.ArrowException, OSError, ValueError) as exc:
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise InPlaceError(f"{url}: corrupt Parquet footer ({why})") from None
    ranges = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        starts, ends = [], []
        for c in range(rg.num_columns):
            col = rg.column(c)
            lo = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                lo = min(lo, col.dictionary_page_offset)
            starts.append(lo)
            ends.append(lo + col.total_compressed_size)
        lo, hi = (min(starts), max(ends)) if starts else (4, 4)
        if not 4 <= lo <= hi <= size - flen - 8:
            raise InPlaceError(f"{url}: row group {g} lies outside the file (corrupt footer)")
        ranges.append((lo, hi))
    order = sorted(range(len(ranges)), key=lambda g: ranges[g])
    sums_sorted = _stream_hash(url, [ranges[g] for g in order], size, opts, requests)
    sums = [""] * len(ranges)
    for k, g in enumerate(order):
        sums[g] = sums_sorted[k]
    units = [
        ShardInfo(unit_path(rel, g), md.row_group(g).num_rows, hi - lo, sums[g])
        for g, (lo, hi) in enumerate(ranges)
    ]
    return _Scanned(rel, size, etag, "", footer, schema, units, [lo for lo, _ in ranges])


def _scan_jsonl(
    url: str,
    rel: str,
    size: int,
    etag: str | None,
    codec: str,
    block_bytes: int,
    opts: dict[str, Any] | None,
    requests: list[int],
) -> _Scanned:
    parts = [_read(url, lo, min(lo + READ_BLOCK, size), opts, requests)
             for lo in range(0, size, READ_BLOCK)]  # fmt: skip
    data = b"".join(parts)
    if len(data) != size:
        raise InPlaceError(f"{url}: changed while it was indexed ({len(data)} of {size} bytes)")
    if codec:
        text = _decompress(data, codec, url)
        rows = _count_lines(text)
        units = [ShardInfo(unit_path(rel, 0), rows, size, storage.checksum(data))] if rows else []
        return _Scanned(rel, size, etag, codec, None, _first_keys(text), units, [0] if rows else [])
    units, offsets = [], []
    pos = 0
    while pos < size:
        nl = data.find(b"\n", pos + block_bytes - 1)
        end = size if nl < 0 else nl + 1
        block = memoryview(data)[pos:end]
        rows = _count_lines(block)
        if rows:
            units.append(ShardInfo(unit_path(rel, len(units)), rows, end - pos,
                                   storage.checksum(block)))  # fmt: skip
            offsets.append(pos)
        pos = end
    return _Scanned(rel, size, etag, "", None, _first_keys(data), units, offsets)


def _decompress(data: bytes, codec: str, url: str) -> bytes:
    try:
        if codec == "gzip":
            return gzip.decompress(data)
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except Exception as exc:  # gzip/zstd raise several error types for damaged streams
        raise InPlaceError(f"{url}: not a readable {codec} stream ({str(exc)[:160]})") from None


def _count_lines(data: bytes | memoryview) -> int:
    """Non-blank lines: what a reader of the block yields (a line that is not JSON is
    counted here and skipped, counted, when read)."""
    return sum(1 for line in bytes(data).split(b"\n") if line.strip())


def _first_keys(data: bytes | memoryview) -> list[str]:
    for line in bytes(data[: 1 << 20]).split(b"\n"):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return sorted(value)
    return []


def _common_schema(fmt: str, scanned: list[_Scanned]) -> dict[str, str]:
    """The manifest schema: Parquet files must agree column for column (the first
    difference is named); JSONL records the keys of the first object."""
    if fmt == "jsonl":
        keys: list[str] = next((s.schema for s in scanned if s.schema), [])
        return {k: "json" for k in keys}
    first = scanned[0]
    for s in scanned[1:]:
        if s.schema != first.schema:
            a, b = first.schema, s.schema
            diff = next(
                (f"column {n!r}: {a.field(n).type if n in a.names else 'absent'} in "
                 f"{first.file}, {b.field(n).type if n in b.names else 'absent'} in {s.file}"
                 for n in [*a.names, *b.names]
                 if n not in a.names or n not in b.names or a.field(n) != b.field(n)),
                "column order differs",
            )  # fmt: skip
            raise InPlaceError(
                f"the Parquet files differ in schema ({diff}): index files of one schema together"
            )
    return {f.name: str(f.type) for f in first.schema}
