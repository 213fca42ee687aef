"""The shard table of a manifest: one row per shard, stored column by column.

A version-2 manifest keeps it in an Arrow IPC file beside ``manifest.json``; a local file is
memory-mapped, so opening a table of a million shards costs a few vectorised checks and no
Python object per shard. Version-1 manifests (shards inline in the JSON) are turned into
the same columns, so everything above this module sees one shape.

Two optional columns, ``widths`` and ``heights`` (a list of int32 per shard, one entry per
sample; 0 where a sample holds no readable image), record image sizes at ingest and
``flashfeed index`` time for the loader's aspect-ratio buckets. Tables without them (older
manifests) read as before; they are not part of the table's digest (they follow from the
shard bytes, which the checksums cover). The optional ``videos`` column (``videocolumns.py``)
records each video member's probe the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from flashfeed import storage
from flashfeed.errors import ManifestError
from flashfeed.format.shardcolumns import (
    SIZE_COLUMNS,
    all_distinct,
    arrow_int32_lists,
    arrow_int64,
    arrow_strings,
    check_image_sizes,
    check_paths,
    escapes,
    first_true,
    int64_numpy,
    list_values_at,
    string_parts,
)
from flashfeed.format.videocolumns import (
    VIDEO_COLUMN,
    VIDEO_TYPE,
    check_videos,
    video_column,
    videos_at,
)

__all__ = [
    "COLUMNS",
    "SIZE_COLUMNS",
    "ShardInfo",
    "ShardTable",
    "check_relative_path",
    "synthetic_shard_table",
]

#: the columns of a shard table, in file order; ``index`` may hold nulls, the others not
COLUMNS = ("path", "samples", "bytes", "checksum", "index")
_SIZE_TYPE = pa.list_(pa.int32())
SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("samples", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("index", pa.string(), nullable=True),
    ]
)
_ITER_CHUNK = 8192


def check_relative_path(path: Any, *, what: str, source: str) -> str:
    """A path inside the dataset prefix: relative, no ``..``, no scheme."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{source}: {what} must be a non-empty string, got {path!r}")
    if escapes(path):
        raise ManifestError(f"{source}: {what} {path!r} escapes the dataset prefix")
    return path


@dataclass(frozen=True)
class ShardInfo:
    """One shard: where it is, what it holds, and the checksum of its bytes."""

    path: str
    samples: int
    bytes: int
    checksum: str
    index: str | None = None

    @classmethod
    def from_dict(cls, d: Any, *, source: str, i: int) -> ShardInfo:
        where = f"shards[{i}]"
        if not isinstance(d, dict):
            raise ManifestError(f"{source}: {where} must be an object")
        missing = {"path", "samples", "bytes", "checksum"} - d.keys()
        if missing:
            raise ManifestError(f"{source}: {where} lacks {sorted(missing)}")
        for k in ("samples", "bytes"):
            v = d[k]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 63:
                raise ManifestError(f"{source}: {where}.{k} must be an integer >= 0")
        if not isinstance(d["checksum"], str) or not d["checksum"].startswith(
            storage.CHECKSUM_PREFIX
        ):
            raise ManifestError(
                f"{source}: {where}.checksum must look like '{storage.CHECKSUM_PREFIX}<hex>'"
            )
        index = d.get("index")
        if index is not None:
            check_relative_path(index, what=f"{where}.index", source=source)
        return cls(
            path=check_relative_path(d["path"], what=f"{where}.path", source=source),
            samples=d["samples"],
            bytes=d["bytes"],
            checksum=d["checksum"],
            index=index,
        )


def _single(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.setflags(write=False)
    return view


class ShardTable:
    """The validated columns of a shard table. Build one with ``from_infos``,
    ``from_columns``, ``from_arrow`` or ``read_ipc``; the constructor trusts its input."""

    def __init__(
        self, path: pa.Array, samples: np.ndarray, sizes: np.ndarray, checksum: pa.Array,
        index: pa.Array, image_sizes: tuple[pa.Array, pa.Array] | None = None,
        videos: pa.Array | None = None,
    ) -> None:  # fmt: skip
        self._path = path
        self._checksum = checksum
        self._index = index
        self._samples = _readonly(samples)
        self._sizes = _readonly(sizes)
        self._image_sizes = image_sizes
        self._videos = videos

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as its columns; unpickling makes the number arrays read-only again
        return (
            ShardTable,
            (self._path, self._samples, self._sizes, self._checksum, self._index,
             self._image_sizes, self._videos),
        )  # fmt: skip

    def with_image_sizes(
        self, widths: Sequence[Sequence[int] | None], heights: Sequence[Sequence[int] | None]
    ) -> ShardTable:
        """This table with per-sample image sizes (one list per shard, None where unknown),
        checked like columns read from a file."""
        table = self.to_arrow()
        table = table.append_column("widths", arrow_int32_lists(widths))
        table = table.append_column("heights", arrow_int32_lists(heights))
        return ShardTable.from_arrow(table, source="shard table")

    def with_videos(self, rows: Sequence[Sequence[dict[str, Any] | None] | None]) -> ShardTable:
        """This table with per-sample video probes (one list per shard, None for a shard
        without videos; per sample a dict of ``VIDEO_FIELDS`` or None), checked like a file."""
        table = self.to_arrow()
        if VIDEO_COLUMN in table.column_names:
            table = table.drop_columns([VIDEO_COLUMN])
        table = table.append_column(pa.field(VIDEO_COLUMN, VIDEO_TYPE), video_column(rows))
        return ShardTable.from_arrow(table, source="shard table")

    @property
    def has_videos(self) -> bool:
        """Whether the table records video probes."""
        return self._videos is not None

    def videos(self, shards: np.ndarray, rows: np.ndarray) -> list[dict[str, Any] | None]:
        """Per sample given by shard and row: its video's probe (codec, frames, fps,
        duration, width, height, bytes), None where unknown or not a video."""
        if self._videos is None:
            return [None] * len(shards)
        return videos_at(self._videos, shards, rows)

    @property
    def has_image_sizes(self) -> bool:
        """Whether the table records image sizes (every shard's, or some null)."""
        return self._image_sizes is not None

    def image_sizes(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``(n, 2)`` int32 ``(width, height)`` of samples given by shard and row; 0 where
        unknown (no size columns, a shard without sizes, not an image)."""
        out = np.zeros((len(shards), 2), np.int32)
        if self._image_sizes is not None and len(shards):
            for col, arr in enumerate(self._image_sizes):
                out[:, col] = list_values_at(arr, shards, rows)
        return out

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_infos(cls, infos: Iterable[ShardInfo]) -> ShardTable:
        infos = list(infos)
        return cls(
            arrow_strings([s.path for s in infos]),
            np.array([s.samples for s in infos], dtype=np.int64),
            np.array([s.bytes for s in infos], dtype=np.int64),
            arrow_strings([s.checksum for s in infos]),
            arrow_strings([s.index for s in infos]),
        )

    @classmethod
    def from_columns(
        cls,
        *,
        path: Any,
        samples: Any,
        bytes: Any,  # the column's name
        checksum: Any,
        index: Any = None,
        source: str = "shard table",
    ) -> ShardTable:
        """A table from whole columns (lists, numpy or Arrow arrays), checked like one read
        from a file; ``index=None`` means no shard has an index."""
        n = len(path)
        cols = {
            "path": pa.array(path, pa.string()),
            "samples": arrow_int64(np.asarray(samples, dtype=np.int64)),
            "bytes": arrow_int64(np.asarray(bytes, dtype=np.int64)),
            "checksum": pa.array(checksum, pa.string()),
            "index": pa.nulls(n, pa.string()) if index is None else pa.array(index, pa.string()),
        }
        return cls.from_arrow(pa.table(cols), source=source)

    @classmethod
    def from_arrow(cls, table: pa.Table, *, source: str) -> ShardTable:
        """Check an Arrow table column by column (types, nulls, sizes, paths, checksums);
        errors name ``source``, the column and the first bad row."""
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise ManifestError(
                f"{source}: the shard table lacks column(s) {missing}; it has {table.column_names}"
            )
        doubled = sorted({c for c in table.column_names if table.column_names.count(c) > 1})
        if doubled:
            raise ManifestError(f"{source}: the shard table has two columns named {doubled}")
        cols: dict[str, pa.Array] = {}
        for c in COLUMNS:
            col = table.column(c)
            want = pa.int64() if c in ("samples", "bytes") else pa.string()
            if col.type not in (want, pa.large_string() if want == pa.string() else want):
                raise ManifestError(
                    f"{source}: shard table column {c!r} must be of type {want}, got {col.type}"
                )
            try:  # offsets, buffer sizes, UTF-8: checked before any kernel reads them
                for chunk in col.chunks:
                    chunk.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise ManifestError(
                    f"{source}: shard table column {c!r} is malformed ({str(exc)[:200]})"
                ) from None
            arr = _single(col)
            cols[c] = arr.cast(pa.string()) if arr.type == pa.large_string() else arr
            if c != "index" and cols[c].null_count:
                row = first_true(cols[c].is_null())
                raise ManifestError(f"{source}: shard table column {c!r} is null in row {row}")
        numbers = {}
        for c in ("samples", "bytes"):
            a = int64_numpy(cols[c])
            if len(a) and a.min() < 0:
                row = int(np.argmax(a < 0))
                raise ManifestError(
                    f"{source}: shard table column {c!r} must be >= 0, row {row} holds {a[row]}"
                )
            numbers[c] = a
        check_paths(cols["path"], "path", source)
        check_paths(cols["index"], "index", source)
        if not all_distinct(cols["path"]):
            raise ManifestError(f"{source}: two shards share one path (shard table column 'path')")
        bad = pc.invert(pc.starts_with(cols["checksum"], storage.CHECKSUM_PREFIX))
        if pc.any(bad).as_py():
            row = first_true(bad)
            raise ManifestError(
                f"{source}: shard table column 'checksum', row {row}: "
                f"{cols['checksum'][row].as_py()!r:.80} must look like "
                f"'{storage.CHECKSUM_PREFIX}<hex>'"
            )
        return cls(
            cols["path"], numbers["samples"], numbers["bytes"], cols["checksum"], cols["index"],
            check_image_sizes(table, numbers["samples"], source),
            check_videos(table, numbers["samples"], source),
        )  # fmt: skip

    @classmethod
    def read_ipc(cls, source_buf: Any, *, source: str) -> ShardTable:
        """A table from the bytes (or a memory map) of an Arrow IPC file, zero-copy."""
        try:
            reader = pa.ipc.open_file(source_buf)
            table = reader.read_all()
            table.column_names  # noqa: B018 - field names that are not UTF-8 fail here
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ManifestError(
                f"{source}: not a readable Arrow IPC shard table ({str(exc)[:200]})"
            ) from None
        return cls.from_arrow(table, source=source)

    # --- output ---------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        table = pa.Table.from_arrays(
            [self._path, arrow_int64(self._samples), arrow_int64(self._sizes), self._checksum,
             self._index],
            schema=SCHEMA,
        )  # fmt: skip
        if self._image_sizes is not None:
            for name, arr in zip(SIZE_COLUMNS, self._image_sizes, strict=True):
                table = table.append_column(pa.field(name, _SIZE_TYPE), arr)
        if self._videos is not None:
            table = table.append_column(pa.field(VIDEO_COLUMN, VIDEO_TYPE), self._videos)
        return table

    def to_ipc(self) -> pa.Buffer:
        """The table as one Arrow IPC file of one record batch (memory-mappable)."""
        sink = pa.BufferOutputStream()
        table = self.to_arrow()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(len(self), 1))
        return sink.getvalue()

    # --- access ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def samples(self) -> np.ndarray:
        """Samples per shard: a read-only int64 array."""
        return self._samples

    @property
    def sizes(self) -> np.ndarray:
        """Bytes per shard: a read-only int64 array."""
        return self._sizes

    def path(self, i: int) -> str:
        return str(self._path[i].as_py())

    def checksum(self, i: int) -> str:
        return str(self._checksum[i].as_py())

    def index(self, i: int) -> str | None:
        v = self._index[i].as_py()
        return None if v is None else str(v)

    def info(self, i: int) -> ShardInfo:
        return ShardInfo(
            path=self.path(i),
            samples=int(self._samples[i]),
            bytes=int(self._sizes[i]),
            checksum=self.checksum(i),
            index=self.index(i),
        )

    def find(self, path: str) -> int:
        """The row of the shard at ``path``, or -1."""
        return int(pc.index(self._path, path).as_py())

    @property
    def num_indexed(self) -> int:
        """Shards that have an index file."""
        return len(self) - self._index.null_count

    def iter_infos(self, start: int = 0, stop: int | None = None) -> Iterator[ShardInfo]:
        stop = len(self) if stop is None else stop
        for a in range(start, stop, _ITER_CHUNK):
            b = min(a + _ITER_CHUNK, stop)
            paths = self._path.slice(a, b - a).to_pylist()
            sums = self._checksum.slice(a, b - a).to_pylist()
            idx = self._index.slice(a, b - a).to_pylist()
            samples = self._samples[a:b].tolist()
            sizes = self._sizes[a:b].tolist()
            for j in range(b - a):
                yield ShardInfo(paths[j], samples[j], sizes[j], sums[j], idx[j])

    @cached_property
    def digest(self) -> str:
        """A hash of every row (path, samples, bytes, checksum, index): the same shards give
        the same digest whichever manifest version or file layout they came from."""
        h = xxhash.xxh3_128()
        h.update(b"flashfeed-shard-table\n")
        h.update(np.int64(len(self)).tobytes())
        for name in COLUMNS:
            h.update(name.encode() + b"\n")
            if name == "samples":
                h.update(self._samples.astype("<i8").tobytes())
            elif name == "bytes":
                h.update(self._sizes.astype("<i8").tobytes())
            else:
                lengths, data = string_parts(getattr(self, "_" + name))
                h.update(lengths.tobytes())
                h.update(data)
        return h.hexdigest()


def synthetic_shard_table(
    num_shards: int,
    *,
    samples_per_shard: int = 1000,
    shard_bytes: int = 1 << 20,
    ext: str = "tar",
    index: bool = True,
) -> ShardTable:
    """A table of ``num_shards`` made-up shards (``shards/000000.tar`` ...), built with
    vectorised Arrow kernels: a million rows in well under a second. For benchmarks and
    tests at scale; the checksums name no real bytes."""
    if num_shards < 0:
        raise ValueError(f"num_shards must be >= 0, got {num_shards}")
    numbers = pc.cast(arrow_int64(np.arange(num_shards, dtype=np.int64)), pa.string())
    width = max(6, len(str(max(num_shards - 1, 0))))
    stem = pc.binary_join_element_wise("shards/", pc.utf8_lpad(numbers, width, "0"), "")
    path = pc.binary_join_element_wise(stem, f".{ext}", "")
    checksum = pc.binary_join_element_wise(
        storage.CHECKSUM_PREFIX, pc.utf8_lpad(numbers, 32, "0"), ""
    )
    return ShardTable(
        _single(path),
        np.full(num_shards, samples_per_shard, dtype=np.int64),
        np.full(num_shards, shard_bytes, dtype=np.int64),
        _single(checksum),
        _single(pc.binary_join_element_wise(path, ".idx", ""))
        if index
        else pa.nulls(num_shards, pa.string()),
    )
