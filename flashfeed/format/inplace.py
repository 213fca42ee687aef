"""Datasets indexed in place: Parquet files and JSONL files read where they lie.

``flashfeed index`` over a folder of Parquet or JSONL files writes a manifest (header
``shard_format`` ``parquet`` or ``jsonl``, ``requires: ["in-place"]``) whose shards are
units of those files: a Parquet row group, or a block of whole JSONL lines found by
scanning for newlines; a ``.jsonl.gz`` or ``.jsonl.zst`` file is one unit (a compressed
stream cannot be entered in the middle). A unit's shard-table row is
``path = "<file>#<unit>"``, ``samples`` = its rows, ``bytes`` = its byte length and
``checksum`` = the xxh3-128 of those bytes, so the cache and the loader check a unit like
any shard, and a file changed after indexing fails there.

Beside the header, the *files table* (``inplace-<hash>.arrow``, named with its size and
checksum in the header's ``source``) holds per file: its path relative to the data root,
size, ETag (object stores) and, for Parquet, the footer, plus every unit's byte offset. The
data root is the manifest's own prefix, or the one named in ``source.root`` when the
manifest was written elsewhere (a read-only source bucket).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from flashfeed import storage
from flashfeed.errors import CorruptShardError, FlashfeedError, ManifestError

__all__ = [
    "CODECS",
    "FILES_PREFIX",
    "IN_PLACE",
    "IN_PLACE_FORMATS",
    "FileChangedError",
    "InPlaceError",
    "InPlaceFiles",
    "check_unit_bytes",
    "is_in_place",
    "read_files_table",
    "split_unit_path",
    "unit_path",
    "unit_rows",
]

#: the ``requires`` feature of an in-place manifest
IN_PLACE = "in-place"
IN_PLACE_FORMATS = ("parquet", "jsonl")
FILES_PREFIX = "inplace-"
#: a JSONL file's compression: '' (none: split into blocks), 'gzip' or 'zstd' (one unit)
CODECS = ("", "gzip", "zstd")

FILES_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("etag", pa.string()),
        pa.field("codec", pa.string(), nullable=False),
        pa.field("footer", pa.binary()),
        pa.field("offsets", pa.list_(pa.int64()), nullable=False),
    ]
)


class FileChangedError(CorruptShardError):
    """A file of an in-place dataset is not what was indexed."""


def check_unit_bytes(data: bytes | memoryview, info: Any, *, url: str) -> None:
    """A unit's bytes as indexed, else one line: the file changed after it was indexed."""
    if len(data) != info.bytes or storage.checksum(data) != info.checksum:
        _, unit = split_unit_path(info.path)
        raise FileChangedError(
            f"{url} changed after it was indexed (unit {unit}, {info.bytes} bytes, no longer "
            "matches its checksum): run `flashfeed index` again to index the new file"
        )


def is_in_place(manifest: Any) -> bool:
    return getattr(manifest, "shard_format", None) in IN_PLACE_FORMATS


def unit_path(file: str, unit: int) -> str:
    """The shard-table path of unit ``unit`` of ``file``."""
    return f"{file}#{unit}"


def split_unit_path(path: str) -> tuple[str, int]:
    """``(file, unit)`` of a unit's shard-table path."""
    file, sep, unit = path.rpartition("#")
    if not sep or not file or not unit.isdigit():
        raise ManifestError(f"in-place shard path {path!r} must look like '<file>#<unit>'")
    return file, int(unit)


def files_table(
    files: list[str],
    sizes: list[int],
    etags: list[str | None],
    codecs: list[str],
    footers: list[bytes | None],
    offsets: list[list[int]],
) -> bytes:
    """The files table as Arrow IPC bytes."""
    table = pa.Table.from_arrays(
        [pa.array(files, pa.string()), pa.array(sizes, pa.int64()),
         pa.array(etags, pa.string()), pa.array(codecs, pa.string()),
         pa.array(footers, pa.binary()), pa.array(offsets, pa.list_(pa.int64()))],
        schema=FILES_SCHEMA,
    )  # fmt: skip
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, FILES_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class FileEntry:
    """One indexed file: where it is, what it was, and where its units start."""

    file: str
    size: int
    etag: str | None
    codec: str
    footer: bytes | None
    offsets: tuple[int, ...]


class InPlaceFiles:
    """The files table of an in-place dataset, with its data root."""

    def __init__(self, root: str, table: pa.Table, *, source: str) -> None:
        self.root = root.rstrip("/")
        self.source = source
        if table.schema.remove_metadata() != FILES_SCHEMA.remove_metadata():
            raise ManifestError(f"{source}: not an in-place files table (schema {table.schema})")
        self._files = table.column("file").to_pylist()
        self._at = {f: i for i, f in enumerate(self._files)}
        if len(self._at) != len(self._files):
            raise ManifestError(f"{source}: a file is listed twice")
        self._table = table
        self._entries: dict[str, FileEntry] = {}

    def __len__(self) -> int:
        return len(self._files)

    @property
    def files(self) -> list[str]:
        return list(self._files)

    def entry(self, file: str) -> FileEntry:
        """The record of ``file``, made once (a unit's every read asks for it)."""
        got = self._entries.get(file)
        if got is not None:
            return got
        i = self._at.get(file)
        if i is None:
            raise ManifestError(f"{self.source}: no file {file!r} in the files table")
        row = {c: self._table.column(c)[i].as_py() for c in FILES_SCHEMA.names}
        got = self._entries[file] = FileEntry(
            file=row["file"], size=row["bytes"], etag=row["etag"], codec=row["codec"],
            footer=row["footer"], offsets=tuple(row["offsets"]),
        )  # fmt: skip
        return got

    def url(self, file: str) -> str:
        return storage.join(self.root, file)

    def location(self, path: str) -> tuple[str, int, FileEntry]:
        """``(file url, byte offset, entry)`` of the unit at shard-table path ``path``."""
        file, unit = split_unit_path(path)
        entry = self.entry(file)
        if unit >= len(entry.offsets):
            raise ManifestError(f"{self.source}: {file} has no unit {unit}")
        return self.url(file), entry.offsets[unit], entry

    @cached_property
    def etags(self) -> dict[str, str | None]:
        return dict(zip(self._files, self._table.column("etag").to_pylist(), strict=True))


def data_root(prefix: str, source: dict[str, Any]) -> str:
    """Where the indexed files lie: ``source.root`` when the manifest names one, else the
    manifest's own prefix."""
    root = source.get("root")
    if root in (None, "", "."):
        return prefix.rstrip("/")
    if not isinstance(root, str):
        raise ManifestError(f"{prefix}: source.root must be a URL string, got {root!r:.80}")
    return root.rstrip("/")


def read_files_table(
    prefix: str, source: dict[str, Any], *, storage_options: dict[str, Any] | None = None
) -> InPlaceFiles:
    """The files table the header's ``source.files`` names, checked against its size and
    checksum."""
    ref = source.get("files")
    if not isinstance(ref, dict) or not isinstance(ref.get("path"), str):
        raise ManifestError(f"{prefix}: an in-place manifest needs source.files {{path, ...}}")
    url = storage.join(prefix, ref["path"])
    try:
        data = storage.read_bytes(url, storage_options=storage_options)
    except FileNotFoundError:
        raise ManifestError(f"{prefix}: its files table {url} is missing") from None
    if len(data) != ref.get("bytes") or storage.checksum(data) != ref.get("checksum"):
        raise ManifestError(f"{url}: the files table does not match its header (replaced?)")
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ManifestError(f"{url}: unreadable files table ({str(exc)[:200]})") from None
    return InPlaceFiles(data_root(prefix, source), table, source=url)


def parquet_metadata(footer: bytes, *, source: str) -> Any:
    """The ``FileMetaData`` of a Parquet footer (the Thrift bytes before the length)."""
    import pyarrow.parquet as pq

    fake = b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"
    try:
        return pq.read_metadata(pa.BufferReader(fake))
    except (pa.ArrowException, OSError) as exc:
        raise CorruptShardError(f"{source}: corrupt Parquet footer ({str(exc)[:160]})") from None


class UnitFile(io.RawIOBase):
    """A file of ``size`` bytes of which only ``data`` at ``offset`` (a unit) and the
    footer's tail are known: what pyarrow needs to read one row group."""

    def __init__(self, size: int, offset: int, data: bytes | memoryview, tail: bytes) -> None:
        super().__init__()
        self._size, self._offset, self._data = size, offset, memoryview(data)
        self._tail, self._pos = tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self._size + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def readinto(self, b: Any) -> int:
        want = min(len(b), self._size - self._pos)
        if want <= 0:
            return 0
        lo, tail_at = self._pos - self._offset, self._size - len(self._tail)
        if lo >= 0 and lo + want <= len(self._data):
            b[:want] = self._data[lo : lo + want]
        elif self._pos >= tail_at:
            b[:want] = self._tail[self._pos - tail_at : self._pos - tail_at + want]
        else:
            raise OSError(f"bytes {self._pos}-{self._pos + want} lie outside the unit read")
        self._pos += want
        return want


def read_row_group(
    data: bytes | memoryview,
    entry: FileEntry,
    unit: int,
    columns: list[str] | None,
    *,
    metadata: Any,
    name: str,
) -> pa.Table:
    """Row group ``unit`` of a Parquet file from its bytes alone (and the indexed footer);
    a row group that does not decode is one line naming it."""
    import pyarrow.parquet as pq

    footer = entry.footer or b""
    tail = footer + struct.pack("<I", len(footer)) + b"PAR1"
    raw = UnitFile(entry.size, entry.offsets[unit], data, tail)
    try:
        pf = pq.ParquetFile(pa.PythonFile(raw, mode="r"), metadata=metadata)
        return pf.read_row_group(unit, columns=columns)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptShardError(
            f"{name}: row group {unit} does not decode ({str(exc).splitlines()[0][:160]})"
        ) from None


class InPlaceError(FlashfeedError, ValueError):
    """A folder cannot be indexed in place (nothing was written)."""


def unit_rows(files: InPlaceFiles, path: str, data: bytes) -> list[Any]:
    """The rows of the unit at ``path`` from its bytes: dicts of a row group's columns, or
    each JSONL line's value (None for a line that is not JSON)."""
    import gzip
    import json

    url, _, entry = files.location(path)
    _, unit = split_unit_path(path)
    if entry.footer is not None:
        md = parquet_metadata(entry.footer, source=url)
        return read_row_group(data, entry, unit, None, metadata=md, name=url).to_pylist()
    if entry.codec == "gzip":
        data = gzip.decompress(data)
    elif entry.codec == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    out: list[Any] = []
    for line in data.split(b"\n"):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
    return out
