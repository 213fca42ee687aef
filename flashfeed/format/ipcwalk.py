"""Where the record batches of an Arrow IPC file lie, found by walking its messages from the
front as its bytes land.

A shard written by another tool (pyarrow's own ``RecordBatchFileWriter``, an older
flashfeed) records no layout (``arrowlayout.py``), and its footer, which locates the record
batches for a file reader, comes last. Its messages locate each other though: after the
schema, each one is the continuation marker ``0xFFFFFFFF``, an int32 metadata length, a
``Message`` flatbuffer saying its body length (and, for a record batch, its row count), then
the body. So once a record batch's header has landed its rows and its bytes are known, and a
reader holding only a prefix of the file knows every record batch whose header lies in it.
The walk goes front to back, as a fill fetches an Arrow shard's parts.

A schema with dictionary fields has dictionary batch messages before the record batches
that use them (and, for deltas, between them). The walk steps over them: each record batch's
span starts where the message before it ended, so it holds the dictionary batches that
precede it, and such a layout is ``sequential`` (record batch ``b`` is read once bytes
``[offsets[0], offsets[b + 1])`` have landed, after the ones before it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from flashfeed.errors import CorruptShardError
from flashfeed.format.arrowlayout import BatchLayout

__all__ = ["IpcWalk", "message_header", "start_walk"]

_CONTINUATION = b"\xff\xff\xff\xff"
_RECORD_BATCH = 3
_DICTIONARY_BATCH = 2
_KINDS = {0: "an empty message", 1: "a schema", 2: "a dictionary batch", 4: "a tensor"}


def message_header(meta: bytes | memoryview, *, where: str) -> tuple[int, int, int]:
    """``(header type, body length, rows)`` of one IPC ``Message`` flatbuffer (the bytes
    after its continuation marker and length); rows is -1 unless it is a record batch
    (header type 3). Any offset outside ``meta`` is a ``CorruptShardError`` naming ``where``."""
    buf = bytes(meta)
    try:
        table = _at(buf, "<I", 0)
        kind = _field(buf, table, 1, "<B")
        body = _field(buf, table, 3, "<q")
        rows = -1
        if kind == _RECORD_BATCH:
            pos = _slot(buf, table, 2)
            if pos is None:
                raise ValueError("a record batch message without its header")
            header = pos + _at(buf, "<I", pos)
            rows = _field(buf, header, 0, "<q")
    except (ValueError, struct.error) as exc:
        raise CorruptShardError(f"{where}: unreadable message metadata ({exc})") from None
    return kind, body, rows


def _at(buf: bytes, fmt: str, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError(f"offset {pos} is outside the {len(buf)}-byte metadata")
    return int(struct.unpack_from(fmt, buf, pos)[0])


def _slot(buf: bytes, table: int, field: int) -> int | None:
    """Where field ``field`` of the flatbuffer table at ``table`` lies (None: absent)."""
    vtable = table - _at(buf, "<i", table)
    size = _at(buf, "<H", vtable)
    if 4 + 2 * field + 2 > size:
        return None
    off = _at(buf, "<H", vtable + 4 + 2 * field)
    return table + off if off else None


def _field(buf: bytes, table: int, field: int, fmt: str) -> int:
    pos = _slot(buf, table, field)
    return 0 if pos is None else _at(buf, fmt, pos)


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


class IpcWalk:
    """The record batches of one Arrow IPC file of ``size`` bytes found so far, message by
    message from byte ``start`` (where the schema message ends); ``rows``: how many the
    manifest says it holds. ``advance`` goes on as far as the landed bytes allow;
    ``layout()`` is what it has found, as a ``BatchLayout``; ``ended`` once it met the
    end-of-stream marker, all rows found. With ``dictionaries`` (the schema has dictionary
    fields) dictionary batch messages are stepped over and the layout is sequential."""

    def __init__(
        self,
        schema: pa.Schema,
        *,
        start: int,
        size: int,
        rows: int,
        name: str,
        dictionaries: bool = False,
    ):
        self.schema = schema
        self.size = size
        self.expected = rows
        self.name = name
        self.dictionaries = dictionaries
        self.ended = False
        self._at = start  # where the next message starts
        self._offsets = [start]
        self._rows = [0]
        self._layout: BatchLayout | None = None

    @property
    def num_batches(self) -> int:
        return len(self._rows) - 1

    def advance(
        self, read: Callable[[int, int], bytes], landed: Callable[[int, int], bool]
    ) -> bool:
        """Walk the messages whose headers have landed (``landed(lo, hi)``: those bytes
        are in; ``read(lo, hi)``: them); whether it found a record batch. A message that
        cannot be one (no continuation marker, lengths past the file's end, another kind,
        more rows than the manifest's) is a ``CorruptShardError`` naming the shard and byte."""
        grew = False
        while not self.ended:
            at = self._at
            where = f"shard {self.name}: the message at byte {at}"
            if at + 8 > self.size:
                raise CorruptShardError(f"{where} is cut off by the shard's end ({self.size})")
            if not landed(at, at + 8):
                break
            prefix = read(at, at + 8)
            if prefix[:4] != _CONTINUATION:
                raise CorruptShardError(
                    f"{where} does not start with the IPC continuation marker "
                    f"(found {bytes(prefix[:4]).hex()})"
                )
            (length,) = struct.unpack("<i", prefix[4:8])
            if length == 0:  # end of stream: the footer follows
                self._end(where)
                break
            if length < 0 or length % 8 or at + 8 + length > self.size:
                raise CorruptShardError(
                    f"{where} has a metadata length of {length}, which does not fit a "
                    f"{self.size}-byte shard"
                )
            if not landed(at + 8, at + 8 + length):
                break
            kind, body, rows = message_header(read(at + 8, at + 8 + length), where=where)
            dictionary = kind == _DICTIONARY_BATCH and self.dictionaries
            if kind != _RECORD_BATCH and not dictionary:
                what = _KINDS.get(kind, f"of unknown type {kind}")
                unless = "" if self.dictionaries else " (its schema has no dictionary fields)"
                raise CorruptShardError(f"{where} is {what}, not a record batch{unless}")
            end = at + 8 + length + body
            if body < 0 or end > self.size:
                raise CorruptShardError(
                    f"{where} has a body of {body} bytes, which does not fit a "
                    f"{self.size}-byte shard"
                )
            self._at = end
            if dictionary:  # part of the next record batch's span
                continue
            total = self._rows[-1] + rows
            if rows < 0 or total > self.expected:
                raise CorruptShardError(
                    f"{where} holds {rows} rows, past the {self.expected} rows the manifest "
                    "gives the shard"
                )
            self._offsets.append(end)
            self._rows.append(total)
            grew = True
        if grew:
            self._layout = None
        return grew

    def _end(self, where: str) -> None:
        if self._rows[-1] != self.expected:
            raise CorruptShardError(
                f"{where} ends the stream after {self._rows[-1]} rows; the manifest gives the "
                f"shard {self.expected}"
            )
        self.ended = True

    def layout(self) -> BatchLayout:
        """The record batches found so far (their bytes may still be landing)."""
        if self._layout is None:
            self._layout = BatchLayout(
                np.asarray(self._offsets, np.int64),
                np.asarray(self._rows, np.int64),
                self.schema,
                sequential=self.dictionaries,
            )
        return self._layout


def start_walk(head: bytes, *, name: str, size: int, rows: int) -> IpcWalk:
    """A walk of the ``size``-byte shard whose schema message is ``head`` (magic and schema
    message: the file's first ``arrowlayout.head_size`` bytes); sequential when its schema
    has dictionary fields (their batches precede the record batches that use them)."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head)[8:])
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise CorruptShardError(f"shard {name}: unreadable schema message ({exc})") from None
    dictionaries = any(_has_dictionary(f.type) for f in schema)
    return IpcWalk(
        schema, start=len(head), size=size, rows=rows, name=name, dictionaries=dictionaries
    )
