"""The shards of a manifest as a sequence of ``ShardInfo``, built lazily from the columnar
``ShardTable``: a million-shard dataset builds no list of a million objects."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import overload

from flashfeed.format.shardtable import ShardInfo, ShardTable

__all__ = ["ShardList"]


class ShardList(Sequence[ShardInfo]):
    """The shards of a manifest as a sequence of ``ShardInfo``, each built when first
    asked for (and kept); iterating builds them in chunks without keeping them."""

    def __init__(self, table: ShardTable) -> None:
        self._table = table
        self._cache: dict[int, ShardInfo] = {}

    def __len__(self) -> int:
        return len(self._table)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[ShardInfo, ...]: ...

    def __getitem__(self, i: int | slice) -> ShardInfo | tuple[ShardInfo, ...]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return tuple(self._table.iter_infos(start, max(start, stop)))
            return tuple(self[j] for j in range(start, stop, step))
        j = operator.index(i)
        n = len(self._table)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"shard {i} out of range: the dataset has {n} shards")
        info = self._cache.get(j)
        if info is None:
            info = self._cache[j] = self._table.info(j)
        return info

    def __iter__(self) -> Iterator[ShardInfo]:
        return self._table.iter_infos()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<ShardList of {len(self)} shards>"

    @property
    def cached(self) -> int:
        """How many ``ShardInfo`` objects have been built and kept so far."""
        return len(self._cache)
