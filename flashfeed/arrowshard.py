"""Arrow shards: Arrow IPC files, memory-mappable, one table per shard."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from .errors import CorruptShardError

__all__ = ["open_arrow", "schema_of", "write_arrow"]


def write_arrow(table: pa.Table, *, max_chunksize: int = 8192) -> bytes:
    """The Arrow IPC file bytes of a table (uncompressed, so readers can memory-map)."""
    if table.num_rows == 0:
        raise ValueError("an empty table makes no shard")
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max_chunksize)
    return sink.getvalue()


def open_arrow(source: str | bytes | memoryview | pa.Buffer, *, name: str = "arrow") -> pa.Table:
    """A table over an Arrow IPC file: memory-mapped for a local path (zero copy),
    or over bytes already in memory."""
    try:
        if isinstance(source, str):
            reader = pa.ipc.open_file(pa.memory_map(source, "r"))
        else:
            reader = pa.ipc.open_file(pa.py_buffer(source))
        return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise CorruptShardError(f"{name}: not a readable Arrow IPC file ({exc})") from None


def schema_of(table: pa.Table) -> dict[str, str]:
    """The manifest's schema for an Arrow table: field -> Arrow type name."""
    return {f.name: str(f.type) for f in table.schema}


def rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()
