"""The order of one pass over what remains of an epoch: its samples in batches, and the
shards it needs in order of first need (``loader/readahead.py`` walks them).

"Plan" means the epoch plan (``flashfeed.plan.plan``) only; a ``PassOrder`` is this rank's part of
it still to read, cut into batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashfeed.plan.plan import locate

__all__ = ["PassOrder", "first_uses", "make_pass_order"]


@dataclass(frozen=True)
class PassOrder:
    """The samples of one pass, in order, cut into ``num_batches`` batches: of
    ``batch_size`` each (the last may be short), or at ``bounds`` (batch starts, then the
    end) when batches vary in size (aspect-ratio buckets)."""

    ids: np.ndarray
    shards: np.ndarray
    rows: np.ndarray
    batch_size: int
    num_batches: int
    bounds: np.ndarray | None = None
    #: per sample, its bucket and image window (aspect-ratio buckets)
    shapes: np.ndarray | None = None
    #: per sample, a uniform draw in [0, 1) that places its video clip
    draws: np.ndarray | None = None

    def same(self, other: PassOrder) -> bool:
        """The same samples in the same batches."""
        return (
            self.batch_size == other.batch_size
            and self.num_batches == other.num_batches
            and np.array_equal(self.ids, other.ids)
            and _same(self.bounds, other.bounds)
        )

    def batch_slice(self, k: int) -> slice:
        if self.bounds is not None:
            end = int(self.bounds[-1])
            if k + 1 >= len(self.bounds):  # past the last batch: nothing
                return slice(end, end)
            return slice(int(self.bounds[k]), int(self.bounds[k + 1]))
        return slice(k * self.batch_size, min((k + 1) * self.batch_size, len(self.ids)))

    def batch_of(self, positions: np.ndarray) -> np.ndarray:
        """The batch of each position in ``ids``."""
        if self.bounds is not None:
            return np.searchsorted(self.bounds, positions, side="right") - 1
        return positions // self.batch_size

    def batch_len(self, k: int) -> int:
        """Samples in batch ``k`` (the last one may be short without ``drop_last``)."""
        sl = self.batch_slice(k)
        return sl.stop - sl.start

    def shard_order(self) -> tuple[list[int], list[int]]:
        """Shards in order of first need, and the batch that first needs each."""
        shards, first = first_uses(self.shards)
        return shards.tolist(), self.batch_of(first).tolist()


def first_uses(shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``shards`` in order of first appearance, and where each first
    appears. One pass (``np.minimum.at`` over a table indexed by shard), not a stable sort of
    the whole pass, which costs most on a mixture's pass (its sources' shards interleaved).
    Where the shard numbers span far more than the pass holds, ``np.unique``'s sort."""
    n = len(shards)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(shards.max()) + 1
    if top > 4 * n + 4096:  # a table that big costs more than the sort
        uniq, first = np.unique(shards, return_index=True)
    else:
        table = np.full(top, n, np.int64)
        np.minimum.at(table, shards, np.arange(n, dtype=np.int64))
        uniq = np.flatnonzero(table < n)
        first = table[uniq]
    order = np.argsort(first)  # first uses are distinct: any sort gives the same order
    return uniq[order], first[order]


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is b if a is None or b is None else bool(np.array_equal(a, b))


def make_pass_order(
    remaining: np.ndarray, shard_sizes: np.ndarray, *, batch_size: int, drop_last: bool
) -> PassOrder:
    n = len(remaining)
    num_batches = n // batch_size if drop_last else -(-n // batch_size)
    ids = remaining[: min(n, num_batches * batch_size)]
    shards, rows = locate(shard_sizes, ids)
    return PassOrder(ids, shards, rows, batch_size, num_batches)
