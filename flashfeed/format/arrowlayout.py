"""Where the record batches of an Arrow shard lie, said at the front of the shard.

flashfeed writes an Arrow shard's record batches at a bounded byte size and records their
byte and row ranges in the schema's metadata (key ``flashfeed.record_batches``). The schema
is the first message of an Arrow IPC file, so a reader holding only the first bytes of a
shard (a cache fill still under way) knows which bytes each record batch needs and can read
a record batch as soon as those bytes have landed, without the footer at the very end.
Byte offsets count from the end of the schema message, so they do not depend on the
metadata's own length.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from flashfeed.errors import CorruptShardError

__all__ = ["LAYOUT_KEY", "BatchLayout", "head_size", "read_layout"]

LAYOUT_KEY = b"flashfeed.record_batches"
_MAGIC = b"ARROW1"
#: the magic (padded to 8 bytes), then the schema message's continuation marker and length
PREFIX = 16


@dataclass(frozen=True)
class BatchLayout:
    """The record batches of one shard: batch ``b`` is the IPC message at bytes
    ``[offsets[b], offsets[b + 1])`` of the file and holds rows ``[rows[b], rows[b + 1])``;
    the schema message (``schema``) lies at bytes ``[0, offsets[0])``. ``sequential``: the
    spans also hold dictionary batches, so batch ``b`` is read after the ones before it,
    once bytes ``[offsets[0], offsets[b + 1])`` are in (``ipcwalk.py``)."""

    offsets: np.ndarray
    rows: np.ndarray
    schema: pa.Schema
    sequential: bool = False

    @property
    def num_batches(self) -> int:
        return len(self.rows) - 1

    @property
    def num_rows(self) -> int:
        return int(self.rows[-1])

    def batch_of(self, rows: np.ndarray) -> np.ndarray:
        """The record batch holding each row."""
        return np.searchsorted(self.rows, rows, side="right") - 1

    def needs(self, b: int) -> tuple[int, int]:
        """The bytes that must have landed before record batch ``b`` can be read."""
        lo = int(self.offsets[0] if self.sequential else self.offsets[b])
        return lo, int(self.offsets[b + 1])


def head_size(first: bytes, *, name: str) -> int | None:
    """The size of magic + schema message from the first ``PREFIX`` bytes of an Arrow IPC
    file; None when they are not those of one (not an IPC file: no layout to read)."""
    if len(first) < PREFIX or first[:6] != _MAGIC or first[8:12] != b"\xff\xff\xff\xff":
        return None
    (length,) = struct.unpack("<i", first[12:16])
    if length <= 0 or length % 8:
        raise CorruptShardError(f"shard {name}: schema message length {length} is not valid")
    return PREFIX + length


def read_layout(head: bytes | memoryview, *, name: str, size: int) -> BatchLayout | None:
    """The layout recorded in the schema message ``head`` (the file's first ``head_size``
    bytes) of a ``size``-byte shard; None when the file records none (written by another
    tool, or before flashfeed recorded it). A layout that cannot be right is an error."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head)[8:])
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise CorruptShardError(f"shard {name}: unreadable schema message ({exc})") from None
    raw = (schema.metadata or {}).get(LAYOUT_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        rel = np.asarray(doc["offsets"], dtype=np.int64)
        rows = np.asarray(doc["rows"], dtype=np.int64)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptShardError(f"shard {name}: unreadable record batch layout ({exc})") from None
    offsets = rel + len(head)
    if (
        len(rel) < 2
        or len(rows) != len(rel)
        or rel[0] != 0
        or rows[0] != 0
        or (np.diff(rel) <= 0).any()
        or (np.diff(rows) < 0).any()
        or offsets[-1] > size
    ):
        raise CorruptShardError(
            f"shard {name}: its record batch layout does not fit a {size}-byte shard"
        )
    return BatchLayout(offsets, rows, schema.remove_metadata())


def layout_metadata(rel_offsets: list[int], rows: list[int]) -> dict[bytes, bytes]:
    """The schema metadata entry recording a layout (offsets from the schema's end)."""
    return {LAYOUT_KEY: json.dumps({"offsets": rel_offsets, "rows": rows}).encode()}
