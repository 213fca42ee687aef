"""Fixed-length integer columns of memory-mapped Arrow shards as numpy views (no copy), and
variable-length integer list columns as (offsets, values) views with a vectorised gather."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from flashfeed.errors import CorruptShardError
from flashfeed.format.arrowshard import open_arrow

__all__ = [
    "ArrowShardView",
    "ListView",
    "column_views",
    "gather_lists",
    "list_index",
    "list_views",
    "open_arrow_view",
    "plain_keys",
]


@dataclass(frozen=True)
class ListView:
    """One record batch of a ``list<int>`` column: row ``r`` is
    ``values[offsets[r]:offsets[r + 1]]``."""

    offsets: np.ndarray
    values: np.ndarray


def list_index(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, index)`` of ``rows`` of a list column with ``offsets``: each row's entry
    count, and where their entries lie in its values, one row after the other."""
    begin = offsets[rows].astype(np.int64, copy=False)
    counts = offsets[rows + 1].astype(np.int64, copy=False) - begin
    first = np.cumsum(counts) - counts
    idx = np.repeat(begin - first, counts)
    idx += np.arange(len(idx), dtype=np.int64)
    return counts, idx


def gather_lists(view: ListView, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, values)`` of ``rows``: each row's entry count, and their entries one row
    after the other (one fancy-index, no per-row Python)."""
    counts, idx = list_index(view.offsets, rows)
    return counts, view.values[idx]


@dataclass
class ArrowShardView:
    """One shard: per column, one 2-D ``(rows, length)`` (or 1-D) view per record batch.
    ``arriving``: set while the shard's fill is under way (``arrowstream.ArrowArrival``):
    the batches not landed yet are empty placeholders until ``catch_up`` adds them."""

    name: str
    num_rows: int
    starts: np.ndarray  # first row of each record batch
    columns: dict[str, list[np.ndarray]]
    keys: pa.Array | pa.ChunkedArray | None  # one array: a take over many chunks costs more
    lists: dict[str, list[ListView]] | None = None
    arriving: Any = None
    _key_memo: tuple[Any, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def catch_up(self) -> int:
        """Add the record batches landed since (a shard still arriving); how many."""
        arrival = self.arriving
        if arrival is None:
            return 0
        added = int(arrival.catch_up(self))
        if arrival.finished:
            self.arriving = None
        return added

    @property
    def stale(self) -> bool:
        """Its fill ended without some of its record batches: open the shard again."""
        return self.arriving is not None and bool(self.arriving.stale)

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows -> (record batch, row inside it)."""
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        return chunk, rows - self.starts[chunk]

    def key(self, row: int) -> str:
        if self.keys is None:
            return str(row)
        return str(self.key_values()[row])

    def key_values(self) -> np.ndarray:
        """The ``__key__`` column as one numpy object array, made once per shard (and again
        when an arriving shard's keys grow): a batch's keys are then one fancy index, where a
        pyarrow ``take`` per batch and shard cost 60 times as much."""
        keys = self.keys
        memo = self._key_memo
        if keys is None:
            raise ValueError(f"shard {self.name} has no __key__ column: name rows by number")
        if memo is None or memo[0] is not keys:
            values = (
                keys.to_numpy(zero_copy_only=False)
                if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)
                else np.array(keys.to_pylist(), dtype=object)  # ints stay ints, nulls None
            )
            memo = (keys, values)
            self._key_memo = memo
        return memo[1]


def column_views(col: pa.ChunkedArray, name: str, shard: str) -> list[np.ndarray]:
    views = []
    for chunk in col.chunks:
        t = chunk.type
        if pa.types.is_integer(t):
            values, length = chunk, 0
        elif (pa.types.is_fixed_size_list(t)) and pa.types.is_integer(t.value_type):
            values, length = chunk.flatten(), t.list_size
        elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(
            t.value_type
        ):
            sizes = np.diff(chunk.offsets.to_numpy())
            if len(sizes) and (sizes != sizes[0]).any():
                raise CorruptShardError(
                    f"shard {shard}: column {name!r} holds sequences of different lengths "
                    f"({sizes.min()}..{sizes.max()}); TokenLoader needs fixed-length sequences"
                )
            values, length = chunk.flatten(), int(sizes[0]) if len(sizes) else 0
        else:
            raise CorruptShardError(
                f"shard {shard}: column {name!r} is {t}, not integers or integer lists"
            )
        if values.null_count:
            raise CorruptShardError(f"shard {shard}: column {name!r} holds nulls")
        arr = values.to_numpy(zero_copy_only=True)
        views.append(arr.reshape(len(chunk), length) if length else arr)
    return views


def list_views(col: pa.ChunkedArray, name: str, shard: str) -> list[ListView]:
    views = []
    for chunk in col.chunks:
        t = chunk.type
        if not (pa.types.is_list(t) and pa.types.is_integer(t.value_type)):
            raise CorruptShardError(f"shard {shard}: column {name!r} is {t}, not list<integer>")
        if chunk.null_count or chunk.values.null_count:
            raise CorruptShardError(f"shard {shard}: column {name!r} holds nulls")
        offsets = chunk.offsets.to_numpy(zero_copy_only=True)
        values = chunk.values.to_numpy(zero_copy_only=True)
        if len(offsets) and (offsets[0] < 0 or offsets[-1] > len(values)):
            raise CorruptShardError(f"shard {shard}: column {name!r} has offsets out of range")
        views.append(ListView(offsets, values))
    return views


def _one_array(col: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The keys of a shard as one array (a copy of the keys only, once per shard opened),
    dictionary-encoded keys decoded (``plain_keys``)."""
    return plain_keys(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())


def plain_keys(keys: pa.Array) -> pa.Array:
    """Dictionary-encoded keys as their values: a batch takes a few keys of a shard each
    time, and taking them from a dictionary array cost twice as much per call."""
    return keys.dictionary_decode() if pa.types.is_dictionary(keys.type) else keys


def open_arrow_view(
    path: str, columns: tuple[str, ...], *, name: str, lists: tuple[str, ...] = ()
) -> ArrowShardView:
    """Memory-map ``path`` and view ``columns`` (zero copy; pages load on first touch), and
    the ``list<int>`` columns ``lists``."""
    table = open_arrow(path, name=name)
    missing = [c for c in (*columns, *lists) if c not in table.column_names]
    if missing:
        raise CorruptShardError(f"shard {name}: no column {missing} (it has {table.column_names})")
    lengths = [len(b) for b in table.column(columns[0]).chunks]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return ArrowShardView(
        name=name,
        num_rows=table.num_rows,
        starts=starts,
        columns={c: column_views(table.column(c), c, name) for c in columns},
        keys=_one_array(table.column("__key__")) if "__key__" in table.column_names else None,
        lists={c: list_views(table.column(c), c, name) for c in lists} if lists else None,
    )
