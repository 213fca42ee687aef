"""Where the rows of a ``TokenLoader`` batch lie in its open shards, and their keys.

A ``RowTable`` covers every shard the loader holds open: the first row of each of their
record batches, and each shard's key prefix. It is made when the open shards change, not per
batch, so a batch that gathers from many shards (a mixture's: a window of shards per source)
locates and names its rows with as few numpy and Python steps as a batch from a few.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .arrowcols import ArrowShardView

if TYPE_CHECKING:
    from .rowgather import RowAddresses

__all__ = ["RowTable", "row_keys"]


class OpenRows(Protocol):
    """What the table reads of an open shard (``openshard.OpenShard``)."""

    view: ArrowShardView
    several: bool
    firsts: np.ndarray  # ``(shard << 32) + first row`` of each record batch
    numbers: np.ndarray  # the number of each record batch


class RowTable:
    """The record batches, key prefixes and views of ``columns`` of the shards ``opened``
    (their ``OpenRows``).

    Rows of any of these shards are located by one ``np.searchsorted`` (a row's record batch
    is the last one of its own shard that starts at or before it: other shards' entries
    never match), so a table of more shards than a batch reads locates its rows the same."""

    def __init__(self, opened: Mapping[int, OpenRows], columns: Sequence[str] = ()) -> None:
        order = sorted(opened)
        if order:
            self.firsts = np.concatenate([opened[s].firsts for s in order])
            self.numbers = np.concatenate([opened[s].numbers for s in order])
        else:
            self.firsts = self.numbers = np.zeros(0, np.int64)
        #: some shard holds several record batches (else a row's number is its place)
        self.several = any(o.several for o in opened.values())
        self.prefix = {s: o.view.name + "/" for s, o in opened.items()}
        #: no shard has a ``__key__`` column: every key is a row number
        self.keyless = all(o.view.keys is None for o in opened.values())
        self.views = {s: o.view for s, o in opened.items()} if not self.keyless else {}
        #: column -> shard -> its record batches' views of the column
        self.columns = {c: {s: o.view.columns[c] for s, o in opened.items()} for c in columns}
        self._addresses: dict[str, RowAddresses] = {}

    def addresses(self, column: str) -> RowAddresses:
        """Where ``column``'s rows lie in every record batch (``rowgather.py``), made on
        first use and kept with the table."""
        got = self._addresses.get(column)
        if got is None:
            from .rowgather import RowAddresses

            got = self._addresses[column] = RowAddresses(
                self.firsts, self.numbers, self.columns[column]
            )
        return got

    def locate(self, shards: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's record batch and row in it."""
        at = (shards.astype(np.int64) << 32) + rows
        i = np.searchsorted(self.firsts, at, side="right") - 1
        return self.numbers[i], at - self.firsts[i]

    def keys(self, shards: list[int], rows: np.ndarray) -> list[str]:
        """``<shard>/<key>`` of each row: the shard's ``__key__`` column, else the row
        number."""
        names = self.prefix
        if self.keyless:
            return [names[s] + str(r) for s, r in zip(shards, rows.tolist(), strict=True)]
        where: dict[int, list[int]] = {}
        for p, s in enumerate(shards):
            where.setdefault(s, []).append(p)
        keys = [""] * len(shards)
        for s, pos in where.items():
            for p, key in zip(pos, row_keys(self.views[s], rows[pos]), strict=True):
                keys[p] = names[s] + str(key)
        return keys


def row_keys(view: ArrowShardView, rows: np.ndarray) -> list[str]:
    """The keys of ``rows``: the shard's ``__key__`` column, else the row number."""
    if view.keys is None:
        return [str(r) for r in rows.tolist()]
    return [str(k) for k in view.key_values()[rows].tolist()]
