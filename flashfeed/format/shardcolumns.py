"""Vectorised checks of Arrow columns for the shard table: no Python object per row, so a
table of a million shards is checked in a fraction of a second."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flashfeed.errors import ManifestError

#: the optional per-sample image size columns of a shard table (both or neither)
SIZE_COLUMNS = ("widths", "heights")
SIZE_TYPE = pa.list_(pa.int32())


def escapes(path: str) -> bool:
    return (
        path.startswith("/")
        or path.startswith("..")
        or "://" in path
        or "\\" in path
        or ".." in path.split("/")
    )


def int64_numpy(arr: pa.Array) -> np.ndarray:
    """A null-free int64 Arrow array as numpy, zero-copy (``to_numpy`` would import pandas,
    a second of start-up for a process that never uses it)."""
    if not len(arr):
        return np.zeros(0, dtype=np.int64)
    return np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr), offset=arr.offset * 8)


def bool_numpy(arr: pa.Array) -> np.ndarray:
    """A null-free boolean Arrow array as a numpy bool array."""
    if not len(arr):
        return np.zeros(0, dtype=bool)
    bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)].astype(bool)


def list_lengths(arr: pa.Array) -> np.ndarray:
    """Entries per row of a list array as int64, -1 for a null row, read from its offsets
    (``pc.fill_null`` with a Python value and ``to_numpy`` import pandas)."""
    n = len(arr)
    if not n:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    lengths = np.diff(offsets).astype(np.int64)
    if arr.null_count:
        lengths[~bool_numpy(arr.is_valid())] = -1
    return lengths


def int32_min(arr: pa.Array) -> int | None:
    """The least non-null value of an int32 array (None if it has none), without pandas."""
    values = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr), offset=arr.offset * 4)
    if arr.null_count:
        values = values[bool_numpy(arr.is_valid())]
    return int(values.min()) if len(values) else None


def arrow_int64(a: np.ndarray) -> pa.Array:
    a = np.ascontiguousarray(a, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(a), [None, pa.py_buffer(a)])


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """A validity bitmap (None when every row is valid)."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def arrow_strings(values: Sequence[str | None]) -> pa.StringArray:
    """A string array from Python strings (None: null) made from its buffers: ``pa.array``
    imports pandas, most of a second of a fresh process's ingest commit or start-up."""
    data = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    valid = _validity(np.array([v is not None for v in values], dtype=bool))
    buffers = [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    return pa.Array.from_buffers(pa.string(), len(data), buffers)


def arrow_int32_lists(rows: Sequence[Sequence[int] | None]) -> pa.ListArray:
    """A list<int32> array from Python lists (None: null), without ``pa.array``'s pandas."""
    lengths = [0 if r is None else len(r) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(
        (x for r in rows if r is not None for x in r), dtype=np.int32, count=int(offsets[-1])
    )
    values = pa.Array.from_buffers(pa.int32(), len(flat), [None, pa.py_buffer(flat)])
    valid = _validity(np.array([r is not None for r in rows], dtype=bool))
    return pa.Array.from_buffers(
        pa.list_(pa.int32()), len(rows), [valid, pa.py_buffer(offsets)], children=[values]
    )


def first_true(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def all_distinct(arr: pa.Array) -> bool:
    """Whether no value repeats: one vectorised comparison when the values are sorted (as
    flashfeed's writers leave them), a hash count otherwise."""
    if len(arr) < 2:
        return True
    if pc.all(pc.less(arr.slice(0, len(arr) - 1), arr.slice(1))).as_py():
        return True
    return bool(pc.count_distinct(arr).as_py() == len(arr))


def check_paths(arr: pa.Array, column: str, source: str) -> None:
    """The path rules over a whole column: a scan of its character data finds the few rows
    that could break them (empty, leading ``/``, ``..``, ``://``, backslash), and only those
    are checked exactly. Null rows (no index) are allowed."""
    n = len(arr)
    if not n:
        return
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    starts, ends = offsets[:-1], offsets[1:]
    rows = [np.flatnonzero(ends == starts)]
    if data_buf is not None and offsets[-1] > offsets[0]:
        data = np.frombuffer(data_buf, dtype=np.uint8, count=int(offsets[-1]))
        lead = pc.starts_with(arr, "/")
        if pc.any(lead).as_py():
            rows.append(np.flatnonzero(bool_numpy(pc.fill_null(lead, False))))
        hit = data == 0x5C  # backslash
        hit |= data == 0x3A  # ':' of '://'
        dots = data[:-1] == 0x2E
        dots &= data[1:] == 0x2E  # '..'
        hit[:-1] |= dots
        rows.append(np.searchsorted(offsets, np.flatnonzero(hit), side="right") - 1)
    candidates = np.unique(np.concatenate(rows))
    for i in candidates.tolist():
        if not 0 <= i < n or not arr[i].is_valid:
            continue
        value = arr[i].as_py()
        if not value or escapes(value):
            what = "must be a non-empty string" if not value else "escapes the dataset prefix"
            raise ManifestError(
                f"{source}: shard table column {column!r}, row {i}: {value!r:.120} {what}"
            )


def string_parts(arr: pa.Array) -> tuple[np.ndarray, bytes | memoryview]:
    """(lengths as int64 with -1 for null, the concatenated bytes) of a string array."""
    if not len(arr):
        return np.zeros(0, dtype="<i8"), b""
    valid = None
    if arr.null_count:
        valid = bool_numpy(arr.is_valid())
        arr = pc.fill_null(arr, "")
    _, offsets_buf, data_buf = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    lengths = np.diff(offsets).astype("<i8")
    if valid is not None:
        lengths[~valid] = -1
    if data_buf is None or n == 0:
        return lengths, b""
    return lengths, memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])]


def checked_per_sample(
    table: pa.Table, name: str, kind: pa.DataType, samples: np.ndarray, source: str
) -> pa.Array:
    """Column ``name`` of ``table`` as one valid list array of type ``kind``, each row a null
    or one entry per sample of its shard (``samples``); else a ``ManifestError`` naming it."""
    col = table.column(name)
    if col.type != kind:
        raise ManifestError(
            f"{source}: shard table column {name!r} must be of type {kind}, got {col.type}"
        )
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ManifestError(f"{source}: shard table column {name!r} is malformed ({exc})") from None
    lengths = list_lengths(arr)
    bad = (lengths != samples) & (lengths != -1)
    if bad.any():
        row = int(np.argmax(bad))
        raise ManifestError(
            f"{source}: shard table column {name!r}, row {row}: {lengths[row]} entries for "
            f"{samples[row]} samples"
        )
    return arr


def check_image_sizes(
    table: pa.Table, samples: np.ndarray, source: str
) -> tuple[pa.Array, pa.Array] | None:
    """The checked ``widths``/``heights`` columns of ``table``, or None when it has neither:
    list<int32>, one entry per sample of the row's shard (or a null row), values >= 0."""
    present = [c for c in SIZE_COLUMNS if c in table.column_names]
    if not present:
        return None
    if len(present) == 1:
        raise ManifestError(f"{source}: the shard table has {present[0]!r} without its pair")
    out = []
    for c in SIZE_COLUMNS:
        arr = checked_per_sample(table, c, SIZE_TYPE, samples, source)
        low = int32_min(arr.flatten()) if len(arr) else None
        if low is not None and low < 0:
            raise ManifestError(f"{source}: shard table column {c!r} holds a negative size")
        out.append(arr)
    return out[0], out[1]


def list_values_at(arr: pa.Array, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Entry ``rows[i]`` of list ``shards[i]`` of a list<int32> array, vectorised; 0 where
    the list is null."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    values = arr.values
    flat = np.frombuffer(values.buffers()[1], np.int32, count=len(values), offset=values.offset * 4)
    out = np.zeros(len(shards), np.int32)
    known = ~bool_numpy(arr.is_null())[shards] if arr.null_count else np.ones(len(shards), bool)
    out[known] = flat[(offsets[shards] + rows)[known]]
    return out
