"""One pass over what remains of an epoch: its samples in batches, and the shards it needs.

``ShardFeeder`` walks the shards in order of first need: it makes sure the shards of the
next few batches are local before the pipeline asks for them (that time is the consumer's
storage wait) and hints the source to fetch further ahead in the background.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from flashfeed.plan import locate

from .sources import ShardSource

__all__ = ["PassPlan", "ShardFeeder", "make_pass"]


@dataclass(frozen=True)
class PassPlan:
    """The samples of one pass, in order, cut into ``num_batches`` batches."""

    ids: np.ndarray
    shards: np.ndarray
    rows: np.ndarray
    batch_size: int
    num_batches: int

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


def make_pass(
    remaining: np.ndarray, shard_sizes: np.ndarray, *, batch_size: int, drop_last: bool
) -> PassPlan:
    n = len(remaining)
    num_batches = n // batch_size if drop_last else -(-n // batch_size)
    ids = remaining[: min(n, num_batches * batch_size)]
    shards, rows = locate(shard_sizes, ids)
    return PassPlan(ids, shards, rows, batch_size, num_batches)


class ShardFeeder:
    """Keeps the shards of batches ``[k, k + lookahead]`` local; read-ahead beyond that."""

    def __init__(
        self, source: ShardSource, plan: PassPlan, *, lookahead: int = 3, readahead: int = 4
    ) -> None:
        self.source = source
        self.order, self.first_batch = plan.shard_order()
        self.lookahead = lookahead
        self.readahead = readahead
        self._ready = 0
        self._hinted = 0
        if self.order:
            source.set_future(self.order)

    def ensure(self, k: int) -> float:
        """Make the shards of batches up to ``k + lookahead`` local; seconds spent waiting."""
        t0 = time.perf_counter()
        limit = k + self.lookahead
        while self._ready < len(self.order) and self.first_batch[self._ready] <= limit:
            self.source.local_path(self.order[self._ready])
            self._ready += 1
        waited = time.perf_counter() - t0
        want = min(len(self.order), self._ready + self.readahead)
        if want > self._hinted:
            start = max(self._hinted, self._ready)
            if want > start:
                self.source.fetch_ahead(self.order[start:want])
            self._hinted = want
        return waited
