"""The order of one pass over what remains of an epoch: its samples in batches, and the
shards it needs in order of first need (``loader/readahead.py`` walks them).

"Plan" means the epoch plan (``flashfeed.plan``) only; a ``PassOrder`` is this rank's part of
it still to read, cut into batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashfeed.plan import locate

__all__ = ["PassOrder", "make_pass_order"]


@dataclass(frozen=True)
class PassOrder:
    """The samples of one pass, in order, cut into ``num_batches`` batches."""

    ids: np.ndarray
    shards: np.ndarray
    rows: np.ndarray
    batch_size: int
    num_batches: int

    def same(self, other: PassOrder) -> bool:
        """The same samples in the same batches."""
        return (
            self.batch_size == other.batch_size
            and self.num_batches == other.num_batches
            and np.array_equal(self.ids, other.ids)
        )

    def batch_slice(self, k: int) -> slice:
        return slice(k * self.batch_size, min((k + 1) * self.batch_size, len(self.ids)))

    def batch_len(self, k: int) -> int:
        """Samples in batch ``k`` (the last one may be short without ``drop_last``)."""
        sl = self.batch_slice(k)
        return sl.stop - sl.start

    def shard_order(self) -> tuple[list[int], list[int]]:
        """Shards in order of first need, and the batch that first needs each."""
        uniq, first = np.unique(self.shards, return_index=True)
        order = np.argsort(first, kind="stable")
        return uniq[order].tolist(), (first[order] // self.batch_size).tolist()


def make_pass_order(
    remaining: np.ndarray, shard_sizes: np.ndarray, *, batch_size: int, drop_last: bool
) -> PassOrder:
    n = len(remaining)
    num_batches = n // batch_size if drop_last else -(-n // batch_size)
    ids = remaining[: min(n, num_batches * batch_size)]
    shards, rows = locate(shard_sizes, ids)
    return PassOrder(ids, shards, rows, batch_size, num_batches)
