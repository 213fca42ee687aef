"""Documents of a unit of a dataset indexed in place, as token ids.

A unit (a Parquet row group, a block of JSONL lines) is read from its bytes alone: a local
file's range read in place and checked against its checksum, or the node cache's copy of
the range. One column is read: a column of token ids (lists of ints) is taken as it is; a
text column is tokenized here with a ``tokenizer.json`` (each document its tokens plus EOS,
as ingest writes them). A document that cannot be read (a JSONL line that is not JSON, not
UTF-8, or lacks the column; a null) becomes no tokens and is counted by reason. Other
columns named by ``extra`` come along as each row's value (None where a line lacks it).
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.format.inplace import (
    FileChangedError,
    check_unit_bytes,
    parquet_metadata,
    read_row_group,
    split_unit_path,
)

from .sources import reads_in_place

__all__ = ["DocTokens", "LocalUnitSource", "UnitReader", "list_tokens", "unit_bytes"]


@dataclass(frozen=True)
class DocTokens:
    """A unit's documents: document ``i`` is ``values[offsets[i]:offsets[i + 1]]``; ``extra``:
    each other column read, its value per row."""

    offsets: np.ndarray
    values: np.ndarray
    skipped: Counter[str]
    extra: dict[str, list[Any]] = field(default_factory=dict)

    def doc(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]


class LocalUnitSource:
    """Units of a local dataset indexed in place: each read is a range of its file, checked
    against the unit's checksum (a file changed since it was indexed is refused)."""

    in_place = True

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._reads = 0
        self._where: dict[int, tuple[str, str, int]] = {}  # unit -> url, local path, offset

    def read(self, shard: int) -> bytes:
        info = self.dataset.shards[shard]
        where = self._where.get(shard)
        if where is None:  # worked out once per unit: each epoch reads every unit again
            url, offset = self.dataset.shard_range(info)
            where = self._where[shard] = (url, storage.filesystem(url)[1], offset)
        url, path, offset = where
        try:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), info.bytes, offset)
        except FileNotFoundError:
            raise FileChangedError(
                f"{url} is gone (it held unit {split_unit_path(info.path)[1]} when indexed)"
            ) from None
        check_unit_bytes(data, info, url=url)
        self._reads += 1
        return data

    def local_path(self, shard: int) -> str:
        """The file that holds unit ``shard`` (the whole file: read the unit with
        ``read``), once the unit's bytes are checked (what the read-ahead waits for)."""
        self.read(shard)
        url, _ = self.dataset.shard_range(shard)
        return str(storage.filesystem(url)[1])

    def fetch_ahead(self, shards: Any) -> None:
        return None

    def need(self, shard: int, rows: Any, batches: Any) -> None:
        return None

    def set_future(self, shards: Any) -> None:
        return None

    def partial(self, shard: int) -> None:
        return None

    def index(self, shard: int) -> list[Any]:
        return []

    def stats(self) -> dict[str, Any]:
        return {"kind": "in-place", "hits": self._reads, "misses": 0}


def unit_bytes(source: Any, shard: int) -> bytes | memoryview:
    """The bytes of unit ``shard``: read in place, or the cache's verified copy."""
    if isinstance(source, LocalUnitSource):
        return source.read(shard)
    with open(source.local_path(shard), "rb") as f:
        return f.read()


class UnitReader:
    """Reads units of ``dataset`` as ``DocTokens`` of ``column``; picklable (the tokenizer
    travels as its JSON and is built once per process)."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        column: str,
        tokenizer_json: str | None,
        eos_id: int | None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.dataset = dataset
        self.column = column
        self.extra = tuple(extra)
        self.tokenizer_json = tokenizer_json
        self.eos_id = eos_id
        self._tokenizer: Any = None
        self._metadata: dict[str, Any] = {}
        #: units kept decoded on flash (``loader/tokens/decoded.py``), set by the loader
        self.kept: Any = None

    @cached_property
    def digest(self) -> str:
        """What this reader makes of a unit (``decoded.reader_digest``)."""
        from .tokens.decoded import reader_digest

        return reader_digest(column=self.column, tokenizer_json=self.tokenizer_json,
                             eos_id=self.eos_id, extra=self.extra)  # fmt: skip

    def kept_unit(self, shard: int) -> DocTokens | None:
        """Unit ``shard`` as kept decoded, when it is (its bytes' checksum names it)."""
        checksum = self.dataset.shards[shard].checksum
        if self.kept is None or not checksum:
            return None
        return self.kept.get(self.digest, checksum)  # type: ignore[no-any-return]

    def at_hand(self, source: Any, shard: int) -> bool:
        """Reading unit ``shard`` is a check of bytes at hand and a map of its kept decode:
        nothing fetched, nothing decoded."""
        checksum = self.dataset.shards[shard].checksum
        if self.kept is None or not checksum or not self.kept.has(self.digest, checksum):
            return False
        ready = getattr(source, "ready_path", None)  # a cache's: its complete copy, if any
        return reads_in_place(source) or (ready is not None and ready(shard) is not None)

    def keep(self, shard: int, docs: DocTokens) -> DocTokens:
        checksum = self.dataset.shards[shard].checksum
        if self.kept is not None and checksum:
            self.kept.put(self.digest, checksum, docs)
        return docs

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokenizer"], state["_metadata"] = None, {}
        return state

    def read(self, source: Any, shard: int) -> DocTokens:
        """Unit ``shard``'s documents: its bytes read and checked (a file changed since it
        was indexed is refused), then decoded, or mapped as kept decoded before."""
        data = unit_bytes(source, shard)
        return self.kept_unit(shard) or self.keep(shard, self.decode(data, shard))

    def decode(self, data: bytes | memoryview, shard: int) -> DocTokens:
        info = self.dataset.shards[shard]
        files = self.dataset.in_place
        if files is None:
            raise ValueError(f"{self.dataset.url} is not indexed in place")
        url, _, entry = files.location(info.path)
        name = f"{url}#{split_unit_path(info.path)[1]}"
        extra: dict[str, list[Any]] = {}
        if self.dataset.manifest.shard_format == "parquet":
            values = self._parquet(data, entry, info.path, url, name, extra)
            if isinstance(values, DocTokens):  # a column of token ids: its own offsets
                if len(values.offsets) - 1 != info.samples:
                    raise CorruptShardError(
                        f"{name}: holds {len(values.offsets) - 1} rows, the index says "
                        f"{info.samples}"
                    )
                return replace(values, extra=extra) if extra else values
        else:
            values = self._jsonl(data, entry.codec, name, extra)
        if len(values) != info.samples:
            raise CorruptShardError(
                f"{name}: holds {len(values)} rows, the index says {info.samples}"
            )
        got = self._tokens(values, name)
        return replace(got, extra=extra) if extra else got

    def _parquet(
        self, data: Any, entry: Any, path: str, url: str, name: str, extra: dict[str, list[Any]]
    ) -> list[Any] | DocTokens:
        md = self._metadata.get(entry.file)
        if md is None:
            md = self._metadata[entry.file] = parquet_metadata(entry.footer or b"", source=url)
        _, unit = split_unit_path(path)
        others = [c for c in self.extra if c != self.column]
        table = read_row_group(data, entry, unit, [self.column, *others], metadata=md, name=name)
        for c in self.extra:
            extra[c] = table.column(c).to_pylist()
        return self.column_values(table.column(self.column), name)

    def column_values(self, col: pa.ChunkedArray, name: str) -> list[Any] | DocTokens:
        """A table's column of documents: lists of token ids as ``DocTokens`` (no Python
        step per row), text as ``("text", value)`` rows for ``_tokens``."""
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            if not pa.types.is_integer(col.type.value_type):
                raise CorruptShardError(
                    f"{name}: column {self.column!r} is {col.type}, not lists of token ids"
                )
            return list_tokens(col)
        return [("text", v) for v in col.to_pylist()]

    def _jsonl(self, data: Any, codec: str, name: str, extra: dict[str, list[Any]]) -> list[Any]:
        if codec == "gzip":
            data = gzip.decompress(data)
        elif codec == "zstd":
            import zstandard

            data = zstandard.ZstdDecompressor().decompressobj().decompress(bytes(data))
        out: list[Any] = []
        lists = [extra.setdefault(c, []) for c in self.extra]
        for line in bytes(data).split(b"\n"):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except UnicodeDecodeError:
                value = ("skip", "invalid-utf8")
            except ValueError:
                value = ("skip", "not-json")
            for c, values in zip(self.extra, lists, strict=True):
                values.append(value.get(c) if isinstance(value, dict) else None)
            if isinstance(value, tuple):
                out.append(value)
                continue
            if not isinstance(value, dict) or self.column not in value:
                out.append(("skip", "missing-column"))
                continue
            v = value[self.column]
            out.append(("text", v) if isinstance(v, str) else ("ids", v))
        return out

    def _encoder(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            if self.tokenizer_json is None:
                raise ValueError(f"column {self.column!r} holds text: give tokenizer=")
            self._tokenizer = Tokenizer.from_str(self.tokenizer_json)
        return self._tokenizer

    def _tokens(self, values: list[Any], name: str) -> DocTokens:
        skipped: Counter[str] = Counter()
        docs: list[Any] = [None] * len(values)
        texts = [(i, v) for i, (k, v) in enumerate(values) if k == "text" and v is not None]
        if texts and self.tokenizer_json is None:
            raise ValueError(
                f"{name}: column {self.column!r} holds text: give tokenizer= (a tokenizer.json)"
            )
        if texts:
            encoded = self._encoder().encode_batch_fast(
                [t for _, t in texts], add_special_tokens=False
            )
            for (i, _), e in zip(texts, encoded, strict=True):
                docs[i] = e.ids
        for i, (kind, v) in enumerate(values):
            if kind == "skip":
                skipped[v] += 1
            elif v is None:
                skipped["null"] += 1
            elif kind == "ids":
                if not isinstance(v, list) or not all(type(t) is int for t in v):
                    raise CorruptShardError(f"{name}: row {i}: {self.column!r} is no token ids")
                docs[i] = v
        lengths = np.zeros(len(values), np.int64)
        eos = self.eos_id
        flat: list[int] = []  # list.extend: C speed, no numpy step per document
        for i, d in enumerate(docs):
            if d is None:
                continue
            flat.extend(d)
            lengths[i] = len(d)
            if eos is not None and values[i][0] == "text":
                flat.append(eos)
                lengths[i] += 1
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return DocTokens(offsets, np.array(flat, np.int64), skipped)


def list_tokens(col: pa.ChunkedArray) -> DocTokens:
    """A list-of-ints column as one flat array and offsets, no Python step per row (a
    null row is no tokens, counted)."""
    chunk = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    skipped: Counter[str] = Counter()
    if chunk.null_count:
        skipped["null"] = chunk.null_count
        chunk = pc.fill_null(chunk, pa.scalar([], chunk.type))
    offsets = np.asarray(chunk.offsets, dtype=np.int64)
    values = chunk.values.to_numpy(zero_copy_only=False)
    first = offsets[0]
    values = values[first : offsets[-1]]
    return DocTokens(offsets - first, values, skipped)
