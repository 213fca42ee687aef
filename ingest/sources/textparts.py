"""Text corpus partitions: how one JSONL(.gz/.zst) byte range or Parquet row group is cut
out of its file and read back as documents, each good or a counted reject.

A partition is the unit of one Ray task. Plain JSONL splits by byte range, line-aligned: a
line belongs to the range that holds its first byte, so ranges may cut anywhere and every
line is read exactly once. A compressed file cannot be entered in the middle, so it is one
partition whole. Parquet splits by row group.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from flashfeed import storage

from .base import StorageContext, read
from .textcheck import LONE_SURROGATE, lone_surrogate

__all__ = [
    "COMPRESSED",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "Doc",
    "Part",
    "file_kind",
    "plan_ranges",
    "read_part",
]

JSONL_SUFFIXES = (".jsonl", ".ndjson")
COMPRESSED = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_SUFFIXES = (".parquet",)
_CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Part:
    """One partition: a byte range of a plain JSONL file (``[start, end)``), a whole
    compressed JSONL file, or one row group of a Parquet file."""

    url: str
    kind: str  # "jsonl", "gzip", "zstd" or "parquet"
    start: int = 0
    end: int = 0
    row_group: int = 0
    size: int = 0


@dataclass(frozen=True)
class Doc:
    """One record of a partition: its ordinal there, where it came from, and either its
    text or why it is skipped (``reason``, ``detail``)."""

    n: int
    source: str
    text: str | None
    reason: str = ""
    detail: str = ""


def file_kind(url: str) -> str | None:
    """``jsonl``, ``gzip``, ``zstd`` or ``parquet`` from a file name; None for others."""
    low = url.lower()
    for ext, kind in COMPRESSED.items():
        if low.endswith(ext) and low[: -len(ext)].endswith(JSONL_SUFFIXES):
            return kind
    if low.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def plan_ranges(url: str, size: int, part_bytes: int) -> list[Part]:
    """The byte ranges of one plain JSONL file, ``part_bytes`` each (the last shorter)."""
    if part_bytes <= 0:
        raise ValueError(f"part_bytes must be > 0, got {part_bytes}")
    return [
        Part(url, "jsonl", s, min(s + part_bytes, size), size=size)
        for s in range(0, max(size, 1), part_bytes)
    ]


class Truncated(Exception):
    """A compressed stream that ends before its frame does."""


def _decompressed(data: bytes, kind: str) -> Iterator[bytes]:
    """The decompressed bytes of every member (gzip) or frame (zstd), in chunks; a stream
    cut short raises ``Truncated``."""
    pos = 0
    while pos < len(data):
        if kind == "gzip":
            d: Any = zlib.decompressobj(wbits=31)
        else:
            import zstandard

            d = zstandard.ZstdDecompressor().decompressobj()
        while not d.eof:
            if pos >= len(data):
                raise Truncated("the stream ends inside a compressed frame")
            chunk = data[pos : pos + _CHUNK // 16]
            pos += len(chunk)
            out = d.decompress(chunk)
            if out:
                yield out
        rest = d.unused_data
        pos -= len(rest)
        if data[pos:].strip(b"\0") == b"":
            return  # trailing zero padding after the last member


def _lines(chunks: Iterable[bytes], limit: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, nbytes)`` of a byte stream, lines without their ``\\n``; a line over
    ``limit`` bytes comes out as None without ever being held whole."""
    buf = bytearray()
    over = False
    seen = 0
    for chunk in chunks:
        start = 0
        while True:
            i = chunk.find(b"\n", start)
            if i < 0:
                seen += len(chunk) - start
                if not over:
                    buf += chunk[start:]
                    if len(buf) > limit:
                        over = True
                        buf.clear()
                break
            seen += i - start
            if over or len(buf) + i - start > limit:
                yield None, seen
            else:
                buf += chunk[start:i]
                yield bytes(buf), seen
            over = False
            seen = 0
            buf.clear()
            start = i + 1
    if over:
        yield None, seen
    elif buf:
        yield bytes(buf), seen


def _range_chunks(part: Part, ctx: StorageContext, limit: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of the lines that start in the range, read with a little
    overhang past its end to finish its last line (bounded by ``limit``)."""
    first = max(part.start - 1, 0)
    data = read(part.url, ctx, start=first, end=part.end) if part.end > first else b""
    if part.start > 0:
        cut = data.find(b"\n")
        if cut < 0:
            return  # the whole range lies inside a line that started before it
        data = data[cut + 1 :]
        first += cut + 1
    if not data:
        return
    yield first, data
    pos, step = part.end, _CHUNK
    while not data.endswith(b"\n") and pos < part.size:
        data = read(part.url, ctx, start=pos, end=min(pos + step, part.size))
        if not data:
            return
        cut = data.find(b"\n")
        if cut >= 0:
            yield pos, data[: cut + 1]
            return
        yield pos, data
        pos += len(data)
        if pos - part.end > limit:
            return  # the line is over the limit already: _lines reports it
        step = min(step * 2, 64 * _CHUNK)


def _doc(n: int, source: str, line: bytes | None, column: str, limit: int) -> Doc | None:
    """One JSONL line as a document, or a reject; None for a blank line."""
    if line is None:
        return Doc(n, source, None, "too_large", f"a line over the {limit}-byte document limit")
    if line.startswith(_BOM):
        line = line[len(_BOM) :]  # a file saved with a byte-order mark: not part of the JSON
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Doc(n, source, None, "invalid_utf8", str(exc))
    try:
        row = json.loads(text)
    except ValueError as exc:
        return Doc(n, source, None, "bad_json", str(exc))
    if not isinstance(row, dict):
        return Doc(n, source, None, "not_an_object", f"a JSON {type(row).__name__}, not an object")
    return _text_doc(n, source, row.get(column, _MISSING), column, limit)


_MISSING = object()


def _text_doc(n: int, source: str, value: Any, column: str, limit: int) -> Doc:
    if value is _MISSING or value is None:
        return Doc(n, source, None, "missing_text", f"no {column!r} field")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Doc(n, source, None, "invalid_utf8", str(exc))
    if not isinstance(value, str):
        return Doc(n, source, None, "missing_text", f"{column!r} is a {type(value).__name__}")
    bad = lone_surrogate(value)
    if bad is not None:
        return Doc(n, source, None, LONE_SURROGATE, f"{column!r}: {bad}")
    if len(value) > limit // 4 and len(value.encode("utf-8")) > limit:
        return Doc(n, source, None, "too_large", f"over the {limit}-byte document limit")
    if not value.strip():
        return Doc(n, source, None, "empty_text", f"{column!r} is empty")
    return Doc(n, source, value)


def _jsonl_docs(part: Part, ctx: StorageContext, column: str, limit: int) -> Iterator[Doc]:
    if part.kind == "jsonl":
        offsets: list[int] = []

        def chunks() -> Iterator[bytes]:
            for off, data in _range_chunks(part, ctx, limit):
                offsets.append(off)
                yield data

        pos = None
        for n, (line, nbytes) in enumerate(_lines(chunks(), limit)):
            pos = offsets[0] if pos is None else pos
            doc = _doc(n, f"{part.url}@{pos}", line, column, limit)
            pos += nbytes + 1
            if doc is not None:
                yield doc
        return
    data = read(part.url, ctx)
    for n, (line, _) in enumerate(_lines(_decompressed(data, part.kind), limit), 1):
        doc = _doc(n, f"{part.url}:{n}", line, column, limit)
        if doc is not None:
            yield doc


def _parquet_docs(part: Part, ctx: StorageContext, column: str, limit: int) -> list[Doc]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = f"{part.url}#rg{part.row_group}"
    fs, path = storage.filesystem(part.url, ctx.options(part.url))
    try:
        with fs.open(path, "rb") as f:
            return _row_group_docs(pq.ParquetFile(f), part, where, column, limit)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return [Doc(-1, where, None, "corrupt_parquet", f"{type(exc).__name__}: {exc}")]


def _row_group_docs(pf: Any, part: Part, where: str, column: str, limit: int) -> list[Doc]:
    names = pf.schema_arrow.names
    if column not in names:
        detail = f"no column {column!r}; the columns are {names}"
        return [Doc(-1, where, None, "missing_text", detail)]
    values = pf.read_row_group(part.row_group, columns=[column]).column(0).to_pylist()
    return [_text_doc(n, f"{where}:{n}", v, column, limit) for n, v in enumerate(values)]


def read_part(part: Part, ctx: StorageContext, *, column: str, limit: int) -> list[Doc]:
    """Every record of one partition, in order: documents and rejects. A compressed file
    cut short is one ``truncated_file`` reject and no documents (nothing partial is kept)."""
    if part.kind == "parquet":
        return _parquet_docs(part, ctx, column, limit)
    try:
        return list(_jsonl_docs(part, ctx, column, limit))
    except (Truncated, zlib.error) as exc:
        return [Doc(-1, part.url, None, "truncated_file", f"{part.kind}: {exc}")]
    except Exception as exc:
        if type(exc).__name__ == "ZstdError":
            return [Doc(-1, part.url, None, "truncated_file", f"zstd: {exc}")]
        raise
