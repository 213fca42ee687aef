"""Units of a dataset indexed in place, kept decoded on the node's flash: read in place once,
mapped from then on.

Reading a unit of a Parquet or JSONL corpus costs its decode (a Parquet list column,
decompressed, then its offsets) or its tokenization (a text column), every epoch. A
``DecodedUnits`` folder keeps each unit's ``DocTokens`` as it came out (token ids per
document, the documents skipped and why, the columns carried) in an Arrow IPC file named
by the unit's checksum, under a folder named by what decoded it (column, tokenizer, EOS,
columns carried). A later read maps that file: the tokens are a view of the page cache, as
``TokenLoader`` reads an ingested dataset's rows.

- A file appears whole or not at all (``atomic_write``); two processes decoding the same
  unit at once each write the same bytes and the last rename wins.
- The unit's checksum (its bytes as indexed) names the file, so a file changed after
  indexing never reads from here: its checksum no longer matches when the unit is read.
- The folder holds at most ``capacity`` bytes: past it, the files read least recently go
  (a read sets a file's time). A file removed while mapped stays readable to its mapper.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from flashfeed.runtime.files import atomic_write, sweep_dead_tmp
from flashfeed.units import parse_size

from ..unitread import DocTokens

__all__ = ["DecodedUnits", "keep_units", "reader_digest"]

_TOKENS = "tokens"
_META = b"flashfeed.decoded"
_I32 = (-(1 << 31), (1 << 31) - 1)
#: a unit's metadata when nothing was skipped and no column is carried (the common case)
_PLAIN: dict[str, Any] = {"skipped": {}, "extra": []}
_PLAIN_RAW = json.dumps(_PLAIN).encode()


def reader_digest(
    *, column: str, tokenizer_json: str | None, eos_id: int | None, extra: tuple[str, ...]
) -> str:
    """What decoded a unit, as 16 hex digits: the same unit read otherwise is another file."""
    what = json.dumps([column, tokenizer_json, eos_id, list(extra)])
    return xxhash.xxh3_64_hexdigest(what.encode("utf-8"))


class DecodedUnits:
    """A folder of decoded units of at most ``capacity`` bytes (see the module)."""

    def __init__(self, root: str, *, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a number of bytes >= 1, got {capacity!r}")
        self.root = root
        self.capacity = capacity
        os.makedirs(root, exist_ok=True)
        sweep_dead_tmp(root)
        self._lock = threading.Lock()
        self._used: int | None = None  # bytes in the folder, counted at the first write
        self.hits = 0
        self.misses = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def path(self, reader: str, checksum: str) -> str:
        name = checksum.replace(":", "-").replace("/", "-")
        return os.path.join(self.root, f"{reader}-{name}.arrow")

    def has(self, reader: str, checksum: str) -> bool:
        """A file is kept for the unit (it may still prove unreadable when mapped)."""
        return os.path.exists(self.path(reader, checksum))

    def get(self, reader: str, checksum: str) -> DocTokens | None:
        """The unit decoded by ``reader`` whose bytes have ``checksum``, mapped; None when
        not kept (or kept in a file that cannot be read, which is removed)."""
        path = self.path(reader, checksum)
        try:
            with open(path, "rb") as f:  # a buffer over mmap opens in a third of the
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # time pa's file does
            batch = pa.ipc.open_file(pa.py_buffer(mapped)).get_batch(0)
            raw = batch.schema.metadata[_META]
            meta = _PLAIN if raw == _PLAIN_RAW else json.loads(raw)
            os.utime(path)  # read now: the last to go
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, pa.ArrowInvalid, KeyError, ValueError):
            _remove(path)  # a damaged file is decoded again
            self.misses += 1
            return None
        self.hits += 1
        tokens = batch.column(_TOKENS)
        # the offsets buffer as it lies (``tokens.offsets`` builds an array first: 10-90 us)
        offsets = np.frombuffer(tokens.buffers()[1], np.int64, len(tokens) + 1, tokens.offset * 8)
        values = tokens.values.to_numpy(zero_copy_only=True)
        extra = {c: batch.column(f"extra:{c}").to_pylist() for c in meta["extra"]}
        return DocTokens(offsets, values, Counter(meta["skipped"]), extra)

    def put(self, reader: str, checksum: str, docs: DocTokens) -> None:
        """Keep ``docs``, making room by removing the files read least recently."""
        values = np.asarray(docs.values)
        if values.dtype == np.int64 and _fits_int32(values):
            values = values.astype(np.int32)  # as a Parquet column of int32 ids reads
        tokens = pa.LargeListArray.from_arrays(
            pa.array(np.asarray(docs.offsets, np.int64)), pa.array(values)
        )
        try:
            extra = [pa.array(v) for v in docs.extra.values()]
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return  # values Arrow cannot hold in one column (mixed types): not kept
        names = [_TOKENS, *(f"extra:{c}" for c in docs.extra)]
        meta = {"skipped": dict(docs.skipped), "extra": list(docs.extra)}
        batch = pa.record_batch([tokens, *extra], names=names, metadata={_META: json.dumps(meta)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        data = sink.getvalue()
        with self._lock:
            if data.size > self.capacity:
                return
            self._make_room(data.size)
            atomic_write(self.path(reader, checksum), memoryview(data), mode=0o644)
            self._used = (self._used or 0) + data.size

    def _make_room(self, size: int) -> None:
        if self._used is None:
            self._used = sum(size for _, size, _ in _files(self.root))
        if self._used + size <= self.capacity:
            return
        for path, n, _ in sorted(_files(self.root), key=lambda f: f[2]):
            _remove(path)
            self._used -= n
            if self._used + size <= self.capacity:
                return

    def stats(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "root": self.root}


def keep_units(reader: Any, root: str | None, capacity: int | str) -> DecodedUnits | None:
    """A loader's ``keep_decoded`` folder (None: units are not kept), given to ``reader``
    (a ``UnitReader``, or a mixture's, each of its sources' readers)."""
    if root is None:
        return None
    if not isinstance(root, str | os.PathLike):
        raise ValueError(f"keep_decoded must be a folder's path or None, got {root!r}")
    kept = DecodedUnits(os.fspath(root), capacity=parse_size(capacity, name="keep_decoded_bytes"))
    for r in getattr(reader, "readers", (reader,)):
        r.kept = kept
    return kept


def _fits_int32(values: np.ndarray) -> bool:
    return not len(values) or bool(values.min() >= _I32[0] and values.max() <= _I32[1])


def _files(root: str) -> list[tuple[str, int, float]]:
    """(path, bytes, last read) of each kept unit."""
    out = []
    with os.scandir(root) as entries:
        for e in entries:
            if e.name.endswith(".arrow"):
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                out.append((e.path, st.st_size, st.st_mtime))
    return out


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
