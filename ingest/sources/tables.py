"""Tables (JSONL, CSV, Parquet): each row a sample; columns map to fields.

``fields`` maps output field -> column (``--field jpg=image_path``). Without it, well-known
column names get WebDataset names (``image`` -> ``jpg``, ``text`` -> ``txt``, ``label`` ->
``cls``) and other columns keep theirs. A string in an image field is a reference to a media
file: relative to the table's folder, or a full URL on the same store.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from .base import (
    Item,
    ItemRows,
    Mapper,
    Record,
    Reject,
    SourceScan,
    StorageContext,
    kind_of_ext,
    list_sized,
    missing_source,
    read,
)
from .format import FunctionReader, Listing, SourceOption, SourceReader

__all__ = [
    "CSV",
    "JSONL",
    "PARQUET",
    "TABLE_EXTS",
    "TableFormat",
    "read_table_item",
    "scan_table",
]

TABLE_EXTS = {"jsonl": (".jsonl", ".ndjson"), "csv": (".csv",), "parquet": (".parquet",)}
DEFAULT_NAMES = {
    "image": "jpg",
    "img": "jpg",
    "image_path": "jpg",
    "path": "jpg",
    "text": "txt",
    "caption": "txt",
    "label": "cls",
    "class": "cls",
}
_BAD_NAME = re.compile(r"[^A-Za-z0-9_\-]+")


def _text(url: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{url}: not UTF-8 text ({exc}); convert it to UTF-8") from None


#: one JSON value at a position of a string, as ``json.loads`` parses it; JSON's whitespace
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by its __init__
_JSON_SPACE = " \t\n\r"


def _loads(url: str, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{url}:{n}: not a JSON object ({exc})") from None


def _rows(url: str, fmt: str, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line_or_row_number, row)`` of one table file; malformed rows are errors that name
    the file and line: a table is data a person wrote, a silent skip would hide a bug."""
    if fmt == "jsonl":
        lines = _text(url, data).split("\n")
        last = len(lines)
        for n, line in enumerate(lines, 1):
            try:  # the decoder's scanner on the line as it is: json.loads less its checks
                row, end = _SCAN(line, 0)
                if end != len(line) and line[end:].strip(_JSON_SPACE):
                    raise ValueError("extra data after the value")
            except (StopIteration, ValueError):
                if not line.strip():
                    continue
                # the line with its newline, as json.loads saw it: the same error, word for word
                row = _loads(url, n, line if n == last else line + "\n")
            if not isinstance(row, dict):
                raise ValueError(f"{url}:{n}: a JSONL row must be an object, got {row!r:.60}")
            yield n, row
    elif fmt == "csv":
        reader = csv.DictReader(io.StringIO(_text(url, data)))
        for n, row in enumerate(reader, 2):
            if None in row:
                raise ValueError(f"{url}:{n}: more values than the header has columns")
            if None in row.values():
                raise ValueError(f"{url}:{n}: fewer values than the header has columns")
            yield n, dict(row)
    else:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data))
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{url}: not a readable Parquet file ({exc})") from None
        for n, row in enumerate(table.to_pylist()):
            yield n, row


def _mapping(columns: list[str], fields: dict[str, str]) -> dict[str, str]:
    """Output field -> column."""
    if fields:
        return dict(fields)
    out: dict[str, str] = {}
    for c in columns:
        name = DEFAULT_NAMES.get(c.lower()) or _BAD_NAME.sub("_", c).strip("_") or "field"
        out.setdefault(name, c)
    return out


def _kind(name: str, value: Any) -> str:
    kind = kind_of_ext(name)
    if kind != "bytes" or value is None:
        return kind
    if isinstance(value, bool | int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict | list):
        return "json"
    return "bytes"


def scan_table(url: str, fmt: str, ctx: StorageContext, fields: dict[str, str]) -> SourceScan:
    listed = list_sized(url, ctx)
    if not listed:
        raise missing_source(url)
    tables = [p for p, _ in listed if p.lower().endswith(TABLE_EXTS[fmt])]
    if not tables:
        raise ValueError(f"{url} holds no {fmt} files ({', '.join(TABLE_EXTS[fmt])})")
    rows: list[tuple[str, int, dict[str, Any]]] = []
    for t in tables:
        rows.extend((t, n, row) for n, row in _rows(t, fmt, read(t, ctx)))
    if not rows:
        raise ValueError(f"{url}: the {fmt} source has no rows")
    columns = _columns([row for _, _, row in rows])
    mapping = _mapping(columns, fields)
    missing = [c for c in mapping.values() if c not in columns]
    if missing:
        raise ValueError(f"{url}: no column {missing[0]!r}; the columns are {columns}")
    kinds: dict[str, str] = {}
    for name, col in mapping.items():
        sample = next((r[col] for _, _, r in rows if r.get(col) is not None), None)
        kinds[name] = _kind(name, sample)
    sizes = _media_sizes(rows, mapping, kinds, ctx)
    return SourceScan(
        format=fmt,
        items=ItemRows(_item_rows(rows, mapping, kinds, sizes)),
        fields=kinds,
        description={"tables": len(tables), "columns": mapping},
        shared={"kinds": kinds},
    )


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every column of ``rows``, in the order they first appear."""
    if len(set().union(*rows)) == len(rows[0]):  # the common case: every row has the first's
        return list(rows[0])
    seen: dict[str, None] = {}
    keys: Any = None
    for row in rows:
        if keys is None or row.keys() != keys:  # most rows have the columns of the last
            keys = row.keys()
            seen.update(dict.fromkeys(keys))
    return list(seen)


def _item_rows(
    rows: list[tuple[str, int, dict[str, Any]]],
    mapping: dict[str, str],
    kinds: dict[str, str],
    sizes: dict[str, int],
) -> list[tuple[Any, ...]]:
    """One item row ``(index, source, size, ref)`` per table row: its values, and the media
    files its image fields name (sized from their listing). Rows, not ``Item``s: a corpus of
    short documents has a row per few hundred bytes, and the driver handles each."""
    pairs = list(mapping.items())
    images = [name for name, kind in kinds.items() if kind == "image"]
    out: list[tuple[Any, ...]] = []
    append = out.append
    for i, (t, n, row) in enumerate(rows):
        values = {name: row.get(col) for name, col in pairs}
        media: dict[str, str] = {}
        size = 0
        for name in images:
            ref = values[name]
            if isinstance(ref, str):
                del values[name]
                media[name] = url = _resolve(t, ref)
                size += sizes.get(url, 0)
        for v in values.values():
            if v is not None:
                size += len(v) if v.__class__ is str else len(str(v))
        append((i, f"{t}:{n}", size, {"values": values, "media": media}))
    return out


def _resolve(table_url: str, ref: str) -> str:
    if "://" in ref or ref.startswith("/"):
        return ref
    base = table_url.rsplit("/", 1)[0]
    if "://" in base:
        proto, rest = base.split("://", 1)
        return f"{proto}://{posixpath.normpath(posixpath.join(rest, ref))}"
    return posixpath.normpath(posixpath.join(base, ref))


def _media_sizes(
    rows: list[tuple[str, int, dict[str, Any]]],
    mapping: dict[str, str],
    kinds: dict[str, str],
    ctx: StorageContext,
) -> dict[str, int]:
    """Sizes of the referenced media, from one listing per table folder."""
    if not any(k == "image" for k in kinds.values()):
        return {}
    folders = sorted({t.rsplit("/", 1)[0] for t, _, _ in rows})
    sizes: dict[str, int] = {}
    for f in folders:
        sizes.update(list_sized(f, ctx))
    return sizes


def typed(name: str, value: Any, kind: str) -> Any:
    """A cell as the value its field's kind promises (CSV cells are all strings)."""
    if value is None:
        return None
    try:
        if kind == "int" and not isinstance(value, int):
            return int(str(value).strip())
        if kind == "float" and not isinstance(value, float):
            return float(str(value).strip())
    except ValueError:
        raise Reject("bad_value", f"{name}={value!r} is not a {kind}") from None
    if kind == "int":
        return int(value)
    if kind == "json" and not isinstance(value, str):
        return json.dumps(value, sort_keys=True)
    if kind == "text" and not isinstance(value, str):
        return str(value)
    return value


def read_table_item(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
    kinds = cache["shared"]["kinds"]
    record: Record = {
        name: typed(name, v, kinds.get(name, "bytes")) for name, v in item.ref["values"].items()
    }
    for name, url in item.ref["media"].items():
        try:
            record[name] = read(url, ctx)
        except FileNotFoundError:
            raise Reject("missing_media", f"{name} refers to {url}, which does not exist") from None
    return record


class TableFormat:
    """One table format (``jsonl``, ``csv`` or ``parquet``): a name and its extensions."""

    options: tuple[SourceOption, ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name

    def detect(self, url: str, listing: Listing) -> bool:
        return listing.any_endswith(TABLE_EXTS[self.name])

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        return scan_table(url, self.name, ctx, fields)

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        return FunctionReader(read_table_item, shared)


JSONL = TableFormat("jsonl")
CSV = TableFormat("csv")
PARQUET = TableFormat("parquet")
