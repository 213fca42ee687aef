"""Rows of a Parquet or JSONL dataset indexed in place as the loader's samples: each row's
columns are its members, by column name, so ``Loader(fields=...)`` picks them as it picks
tar members (``{"image": "image", "caption": "caption"}``) and DALI decodes image bytes.

A column of bytes is a member as it is; a Hugging Face ``Image`` column (a struct of
``bytes`` and ``path``) is its ``bytes``; text is its UTF-8; an integer is its decimal
digits, also as ``cls`` (a label); anything else is its JSON. A null is no member (an
optional field, or a one-line error naming the row and field).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flashfeed.dataset import Dataset
from flashfeed.format.inplace import parquet_metadata, read_row_group, split_unit_path

from ..shardreader import ShardReader
from ..sources import ShardSource
from ..unitread import unit_bytes

__all__ = ["UnitMemberReader", "member_reader"]

Members = dict[str, np.ndarray]


def _member(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return np.frombuffer(value, np.uint8)
    if isinstance(value, dict) and "bytes" in value:  # a Hugging Face Image feature
        return _member(value["bytes"])
    if isinstance(value, str):
        return np.frombuffer(value.encode(), np.uint8)
    if isinstance(value, bool):
        return np.frombuffer(json.dumps(value).encode(), np.uint8)
    if isinstance(value, int):
        return np.frombuffer(str(value).encode(), np.uint8)
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _rows(columns: dict[str, list[Any]], n: int) -> list[Members]:
    rows: list[Members] = [{} for _ in range(n)]
    for name, values in columns.items():
        for i, v in enumerate(values):
            m = _member(v)
            if m is not None:
                rows[i][name] = m
                if isinstance(v, int) and not isinstance(v, bool):
                    rows[i]["cls"] = m
    return rows


class UnitMemberReader(ShardReader):
    """``ShardReader`` over units indexed in place: a unit is read whole (its byte range,
    checked), its rows kept as members; ``max_open`` units stay decoded."""

    def __init__(
        self, source: ShardSource, shard_names: Sequence[str], dataset: Dataset,
        *, max_open: int = 8,
    ) -> None:  # fmt: skip
        super().__init__(source, shard_names, max_open=max_open)
        self.dataset = dataset
        self._units: OrderedDict[int, list[Members]] = OrderedDict()
        self._metadata: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_units"], state["_metadata"] = OrderedDict(), {}
        return state

    def _unit(self, shard: int) -> list[Members]:
        got = self._units.get(shard)
        if got is not None:
            self._units.move_to_end(shard)
            return got
        info = self.dataset.shards[shard]
        files = self.dataset.in_place
        if files is None:
            raise ValueError(f"{self.dataset.url} is not indexed in place")
        url, _, entry = files.location(info.path)
        _, unit = split_unit_path(info.path)
        data = unit_bytes(self.source, shard)
        if self.dataset.manifest.shard_format == "parquet":
            md = self._metadata.get(entry.file)
            if md is None:
                md = self._metadata[entry.file] = parquet_metadata(entry.footer or b"", source=url)
            table: pa.Table = read_row_group(
                data, entry, unit, None, metadata=md, name=f"{url}#{unit}"
            )
            got = _rows({c: table.column(c).to_pylist() for c in table.column_names}, len(table))
        else:
            got = _jsonl_rows(bytes(data))
        self._units[shard] = got
        while len(self._units) > self.max_open:
            self._units.popitem(last=False)
        return got

    def key(self, shard: int, row: int) -> str:
        return str(row)

    def members(self, shard: int, row: int) -> tuple[str, Members]:
        return str(row), self._unit(shard)[row]

    def name(self, shard: int) -> str:
        return self.shard_names[shard]

    def close(self) -> None:
        self._units.clear()


def _jsonl_rows(data: bytes) -> list[Members]:
    rows: list[Members] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        rows.append({} if not isinstance(value, dict) else _rows(
            {k: [v] for k, v in value.items()}, 1)[0])  # fmt: skip
    return rows


def member_reader(source: ShardSource, shard_names: Sequence[str], dataset: Any) -> ShardReader:
    """The reader of a ``Loader``'s samples: tar members, or rows of units in place."""
    if getattr(dataset, "in_place", None) is not None:
        return UnitMemberReader(source, shard_names, dataset)
    return ShardReader(source, shard_names)
