"""An Arrow shard read while its cache fill is under way, record batch by record batch.

The fill's part file is mapped at its full size; the schema message at its front records
where each record batch lies (``flashfeed.format.arrowlayout``), or, when it records nothing, the
walk of the messages landed so far finds them (``flashfeed.format.ipcwalk``). A record batch joins
the view (``ArrowShardView``, one entry per record batch, as for a whole shard) once all of
its bytes are marked landed: ``pa.ipc.read_record_batch`` on those bytes, zero copy. A shard
with dictionary fields is read in order by one IPC stream reader over the mapped file (the
file after its magic is a stream: schema, dictionary batches, record batches), a record
batch once it and everything before it has landed, so it comes with its dictionaries, also
zero copy. Entries of batches not landed yet are empty placeholders of the right shape; the
loader gathers rows only after ``StreamFeeder`` has waited for their batches (``rows_landed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from flashfeed.errors import CorruptShardError
from flashfeed.runtime.fdpath import map_readonly

from .arrowcols import (
    ArrowShardView,
    ListView,
    column_views,
    list_views,
    plain_keys,
)

if TYPE_CHECKING:
    from flashfeed.cache import FillView, PartialShard
    from flashfeed.format.arrowlayout import BatchLayout

__all__ = ["ArrowArrival", "open_arriving_view", "rows_landed"]


def rows_landed(layout: BatchLayout, progress: FillView, rows: list[int]) -> bool:
    """Whether the schema and the record batches holding ``rows`` have all landed."""
    if not progress.done(0, int(layout.offsets[0])):
        return False
    if any(r >= layout.num_rows for r in rows):
        return False  # not located yet (a walk), or past the shard's: read whole, it fails there
    batches = np.unique(layout.batch_of(np.asarray(rows, np.int64))).tolist()
    if layout.sequential:  # the last one's bytes and all before it
        batches = batches[-1:]
    return all(progress.done(*layout.needs(b)) for b in batches)


class ArrowArrival:
    """The record batches of a view still to land, and the mapped part file they land in.
    A shard walked as it lands (``partial.walk``) also has rows not located yet: its view
    ends with one empty placeholder for them, split as the walk finds their batches."""

    def __init__(
        self,
        partial: PartialShard,
        columns: tuple[str, ...],
        lists: tuple[str, ...],
        name: str,
    ) -> None:
        layout = partial.located()
        if layout is None:
            raise ValueError(f"shard {name}: its fill locates no record batches")
        self.partial = partial
        self.layout = layout
        self.num_rows = layout.num_rows if partial.walk is None else partial.walk.expected
        self.progress = partial.progress
        self.columns = columns
        self.lists = lists
        self.name = name
        self._mmap = map_readonly(partial.part)  # a node service's descriptor, too
        if len(self._mmap) < int(self.layout.offsets[-1]):
            raise CorruptShardError(f"shard {name}: its part file is shorter than its layout")
        self._buf = pa.py_buffer(self._mmap)
        #: the stream reader of a sequential layout (dictionaries): batches in file order
        self._stream: tuple[pa.BufferReader, pa.ipc.RecordBatchStreamReader] | None = None
        if layout.sequential:
            self._stream = _open_stream(self._buf, int(layout.offsets[0]), name)
        self.pending = list(range(self.layout.num_batches))
        #: the fill ended without some of the batches (it failed): open the shard again
        self.stale = False
        #: the ``__key__`` column per record batch: nulls until the batch lands
        self.keys: list[pa.Array] = []
        self.key_type = None
        if layout.schema.get_field_index("__key__") >= 0:
            self.key_type = layout.schema.field("__key__").type
            if pa.types.is_dictionary(self.key_type):  # kept decoded (``plain_keys``)
                self.key_type = self.key_type.value_type
            self.keys = [pa.nulls(int(n), self.key_type) for n in np.diff(layout.rows)]
        #: per column, the placeholder of a record batch not landed yet
        self.blank = _blanks(layout.schema, columns, name)

    @property
    def tail(self) -> int:
        """Rows not located yet (a walked shard's): one placeholder at the view's end."""
        return self.num_rows - self.layout.num_rows

    @property
    def finished(self) -> bool:
        """Every record batch has landed in the view (and a walk has met the stream's end)."""
        walk = self.partial.walk
        return not self.pending and not self.tail and (walk is None or walk.ended)

    def starts(self) -> np.ndarray:
        """First row of each of the view's entries: the record batches, then the tail."""
        rows = self.layout.rows
        return rows.copy() if self.tail else rows[:-1].copy()

    def joined_keys(self) -> pa.Array | pa.ChunkedArray:
        """The ``__key__`` column so far: the landed batches' keys, nulls for the rest; one
        array once all have landed (a take over many chunks costs more)."""
        tail = [pa.nulls(self.tail, self.key_type)] if self.tail else []
        keys = pa.chunked_array([*self.keys, *tail], type=self.key_type)
        return keys if self.pending or self.tail else keys.combine_chunks()

    def catch_up(self, view: ArrowShardView) -> int:
        """Add the batches landed since the last call to ``view``; how many were added."""
        if self.stale:  # its fill ended and its progress is closed: nothing more lands here
            return 0
        walk = self.partial.walk
        if walk is not None and not walk.ended:
            self._walk(view)
        lay, added, still = self.layout, 0, []
        for n, b in enumerate(self.pending):
            lo, hi = int(lay.offsets[b]), int(lay.offsets[b + 1])
            if not self.progress.done(lo, hi):
                if self._stream is not None:  # in order: the rest waits for this one
                    still.extend(self.pending[n:])
                    break
                still.append(b)
                continue
            self._add(view, b, self._read(b, lo, hi))
            added += 1
        self.pending = still
        if added and view.keys is not None:
            view.keys = self.joined_keys()
        if self.finished:
            self.progress.close()
        elif self.progress.ended():
            self.stale = True
            self.progress.close()
        return added

    def _walk(self, view: ArrowShardView) -> None:
        """Record batches the walk found since: the tail placeholder split into them."""
        old = self.layout.num_batches
        lay = self.partial.located()
        if lay is None:
            return
        self.layout, new = lay, lay.num_batches - old
        if not new:
            return
        sizes = np.diff(lay.rows)[old:]
        self.pending.extend(range(old, old + new))
        if self.key_type is not None:
            self.keys.extend(pa.nulls(int(n), self.key_type) for n in sizes)
        tail = 1 if self.tail else 0
        for c in self.columns:
            held = view.columns[c][:old]
            view.columns[c] = [*held, *[self.blank[c]] * (new + tail)]
        no_list = ListView(np.zeros(0, np.int64), np.zeros(0, np.int64))
        for c in self.lists:
            held_lists = (view.lists or {})[c][:old]
            (view.lists or {})[c] = [*held_lists, *[no_list] * (new + tail)]
        view.starts = self.starts()  # a new array: the gather's lookups are made again
        if view.keys is not None:
            view.keys = self.joined_keys()

    def _read(self, b: int, lo: int, hi: int) -> pa.RecordBatch:
        lay = self.layout
        try:
            if self._stream is None:
                batch = pa.ipc.read_record_batch(self._buf.slice(lo, hi - lo), lay.schema)
            else:  # the next one in file order (dictionary batches before it read on the way)
                source, reader = self._stream
                batch = reader.read_next_batch()
                if source.tell() != hi:
                    raise pa.ArrowInvalid(f"the stream reader stopped at byte {source.tell()}")
            # its bytes have not been checksummed yet: bounds and offsets checked before use
            # (Arrow reads IPC buffers as they are; a garbled one would be read out of bounds)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, StopIteration) as exc:  # Arrow IO errors are OSError
            raise CorruptShardError(
                f"shard {self.name}: record batch {b} (bytes {lo}-{hi}) is unreadable ({exc})"
            ) from None
        want = int(lay.rows[b + 1] - lay.rows[b])
        if batch.num_rows != want:
            raise CorruptShardError(
                f"shard {self.name}: record batch {b} holds {batch.num_rows} rows, its layout "
                f"says {want}"
            )
        return batch

    def _add(self, view: ArrowShardView, b: int, batch: pa.RecordBatch) -> None:
        for c in self.columns:
            got = column_views(pa.chunked_array([batch.column(c)]), c, self.name)[0]
            held = view.columns[c]
            if held[b].shape[1:] != got.shape[1:]:  # placeholders made before the first batch
                self.blank[c] = np.empty((0, *got.shape[1:]), got.dtype)
                for i in range(len(held)):
                    if not len(held[i]):
                        held[i] = self.blank[c]
            held[b] = got
        held_lists = view.lists or {}
        for c in self.lists:
            held_lists[c][b] = list_views(pa.chunked_array([batch.column(c)]), c, self.name)[0]
        if view.keys is not None:
            self.keys[b] = plain_keys(batch.column("__key__"))


def _open_stream(
    buf: pa.Buffer, start: int, name: str
) -> tuple[pa.BufferReader, pa.ipc.RecordBatchStreamReader]:
    """An IPC stream reader over the file's bytes after its magic, the schema read (it ends
    at ``start``): positions of the reader's source are those of the file."""
    magic = 8  # "ARROW1" padded to 8 bytes: what follows is an IPC stream
    source = pa.BufferReader(buf)
    source.seek(magic)
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptShardError(f"shard {name}: unreadable schema message ({exc})") from None
    if source.tell() != start:
        raise CorruptShardError(
            f"shard {name}: its schema message ends at byte {source.tell()}, not {start}"
        )
    return source, reader


def _blanks(schema: pa.Schema, columns: tuple[str, ...], name: str) -> dict[str, np.ndarray]:
    """An empty view per column: the placeholder of a record batch not landed yet."""
    return {
        c: column_views(pa.chunked_array([pa.array([], type=schema.field(c).type)]), c, name)[0]
        for c in columns
    }


def open_arriving_view(
    partial: PartialShard, columns: tuple[str, ...], *, name: str, lists: tuple[str, ...] = ()
) -> ArrowShardView:
    """A view of a shard still arriving (``partial.layout`` or ``partial.walk`` set): the
    batches landed so far, the rest added by ``view.catch_up()``."""
    found = partial.layout if partial.layout is not None else partial.walk
    if found is None:
        raise ValueError(f"shard {name}: its fill locates no record batches")
    schema = found.schema
    missing = [c for c in (*columns, *lists) if schema.get_field_index(c) < 0]
    if missing:
        raise CorruptShardError(f"shard {name}: no column {missing} (it has {schema.names})")
    arrival = ArrowArrival(partial, columns, lists, name)
    starts = arrival.starts()
    n = len(starts)
    no_list = ListView(np.zeros(0, np.int64), np.zeros(0, np.int64))
    key_type = arrival.key_type
    view = ArrowShardView(
        name=name,
        num_rows=arrival.num_rows,
        starts=starts,
        columns={c: [arrival.blank[c]] * n for c in columns},
        keys=arrival.joined_keys() if key_type else None,
        lists={c: [no_list] * n for c in lists} if lists else None,
        arriving=arrival,
    )
    view.catch_up()
    return view
