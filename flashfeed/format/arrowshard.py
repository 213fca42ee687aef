"""Arrow shards: Arrow IPC files, memory-mappable, one table per shard, written as record
batches of a bounded byte size whose ranges the schema records (``arrowlayout.py``), so that
a shard can be read batch by batch while it arrives."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from flashfeed.errors import CorruptShardError
from flashfeed.format.arrowlayout import LAYOUT_KEY, head_size, layout_metadata
from flashfeed.runtime.fdpath import is_fd_path, map_readonly

__all__ = ["BATCH_BYTES", "open_arrow", "schema_of", "write_arrow"]

#: the default bound on one record batch's bytes: a few of the cache's 1 MiB progress marks,
#: few enough batches per shard that a gather rarely touches many
BATCH_BYTES = 4 << 20


def write_arrow(
    table: pa.Table, *, max_chunksize: int = 8192, batch_bytes: int | None = BATCH_BYTES
) -> bytes:
    """The Arrow IPC file bytes of a table (uncompressed, so readers can memory-map), in
    record batches of at most ``max_chunksize`` rows and about ``batch_bytes`` bytes (at
    least one row), their byte and row ranges recorded in the schema's metadata. With
    ``batch_bytes=None`` batches are cut by rows only and no ranges are recorded."""
    if table.num_rows == 0:
        raise ValueError("an empty table makes no shard")
    if max_chunksize <= 0:
        raise ValueError(f"max_chunksize must be > 0 rows, got {max_chunksize}")
    if batch_bytes is None:
        return _write(table, table.schema, max_chunksize)[0]
    if batch_bytes <= 0:
        raise ValueError(f"batch_bytes must be > 0 or None, got {batch_bytes}")
    if any(pa.types.is_dictionary(f.type) for f in table.schema):
        return _write(table, table.schema, max_chunksize)[0]  # dictionaries precede batches
    per_row = max(1, table.nbytes // table.num_rows)
    rows_per_batch = max(1, min(max_chunksize, batch_bytes // per_row))
    schema = table.schema.remove_metadata() if table.schema.metadata else table.schema
    meta = dict(table.schema.metadata or {})
    meta.pop(LAYOUT_KEY, None)
    # batch messages do not depend on the schema's metadata: measure them once, then record
    data, ends = _write(table, schema.with_metadata(meta), rows_per_batch)
    rel, rows = _relative(data, ends, table, rows_per_batch)
    out, out_ends = _write(
        table, schema.with_metadata({**meta, **layout_metadata(rel, rows)}), rows_per_batch
    )
    if _relative(out, out_ends, table, rows_per_batch)[0] != rel:
        raise RuntimeError("record batch offsets moved with the schema's metadata")
    return out


def _write(table: pa.Table, schema: pa.Schema, rows: int) -> tuple[bytes, list[int]]:
    """The file's bytes and where each record batch message ends."""
    sink = io.BytesIO()
    ends = []
    with pa.ipc.new_file(sink, schema) as writer:
        for batch in table.to_batches(max_chunksize=rows):
            writer.write_batch(batch)
            ends.append(sink.tell())
    return sink.getvalue(), ends


def _relative(
    data: bytes, ends: list[int], table: pa.Table, rows_per_batch: int
) -> tuple[list[int], list[int]]:
    """Batch offsets from the end of the schema message, and the batches' first rows."""
    head = head_size(data[:16], name="new shard")
    if head is None:
        raise RuntimeError("pyarrow wrote an Arrow IPC file without the expected prefix")
    rel = [0, *(e - head for e in ends)]
    rows = [0]
    for batch in table.to_batches(max_chunksize=rows_per_batch):
        rows.append(rows[-1] + batch.num_rows)
    return rel, rows


def open_arrow(source: str | bytes | memoryview | pa.Buffer, *, name: str = "arrow") -> pa.Table:
    """A table over an Arrow IPC file: memory-mapped for a local path (zero copy),
    or over bytes already in memory."""
    try:
        if isinstance(source, str) and is_fd_path(source):
            # a descriptor (a node service's) of a file this user may not open by name
            reader = pa.ipc.open_file(pa.py_buffer(map_readonly(source)))
        elif isinstance(source, str):
            reader = pa.ipc.open_file(pa.memory_map(source, "r"))
        else:
            reader = pa.ipc.open_file(pa.py_buffer(source))
        return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        raise CorruptShardError(f"{name}: not a readable Arrow IPC file ({exc})") from None


def schema_of(table: pa.Table) -> dict[str, str]:
    """The manifest's schema for an Arrow table: field -> Arrow type name."""
    return {f.name: str(f.type) for f in table.schema}


def rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()
