"""Which cached shard to evict: Belady when the read order is known, LRU otherwise.

Pure functions of what is cached and of the future read order; no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Candidate",
    "FutureOrder",
    "MixtureFuture",
    "belady_hits",
    "eviction_order",
    "lru_hits",
]


class FutureOrder:
    """The upcoming read order of one dataset's shards, and where the reader stands in it.

    ``advance(shard)`` moves the position past the shard's next occurrence when that is
    within ``lookahead`` positions (a read in plan order); repeated reads of a shard read in
    the last ``active`` positions do not jump ahead. Shards read in the last ``active``
    positions count as in use now (distance 0): they are still being read.
    """

    def __init__(self, order: Sequence[int], *, lookahead: int = 64, active: int = 4) -> None:
        if lookahead < 1 or active < 0:
            raise ValueError(f"need lookahead >= 1 and active >= 0, got {lookahead}, {active}")
        self.order = [int(s) for s in order]
        self.lookahead = lookahead
        self.active = active
        self.position = 0
        self._at: dict[int, list[int]] = {}
        for pos, shard in enumerate(self.order):
            self._at.setdefault(shard, []).append(pos)

    def next_use(self, shard: int) -> float:
        """Positions until ``shard`` is read again (0 if being read), ``inf`` if never."""
        positions = self._at.get(shard)
        if not positions:
            return math.inf
        k = bisect.bisect_left(positions, self.position)
        if k > 0 and positions[k - 1] >= self.position - self.active:
            return 0.0
        if k == len(positions):
            return math.inf
        return float(positions[k] - self.position + 1)

    def advance(self, shard: int) -> None:
        positions = self._at.get(shard)
        if not positions:
            return
        k = bisect.bisect_left(positions, self.position)
        if k > 0 and positions[k - 1] >= self.position - max(1, self.active):
            return  # read again while it is still being consumed
        if k < len(positions) and positions[k] - self.position < self.lookahead:
            self.position = positions[k] + 1

    def upcoming(self, limit: int) -> list[int]:
        """The next ``limit`` distinct shards from the current position."""
        out: list[int] = []
        seen: set[int] = set()
        for s in self.order[self.position :]:
            if s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) >= limit:
                    break
        return out


class MixtureFuture:
    """The upcoming read order of several datasets read as one mixture: one clock for all.

    ``order`` lists ``(dataset key, shard)`` in the merged read order. Each source keeps its
    own ``FutureOrder`` over its part of it: a read moves that source on, and its shards
    among its own last ``active`` reads count as in use (a source reads a window of its own
    shards at once, at its own pace). Any other shard's next use is counted on the merged
    order, from the furthest read so far, so shards of different sources compare.
    """

    def __init__(
        self,
        order: Sequence[tuple[str, int]],
        *,
        keys: Sequence[str] = (),
        lookahead: int = 64,
        active: int = 4,
    ) -> None:
        self.order = [(k, int(s)) for k, s in order]
        self.position = 0
        # a source's sub-order -> its merged positions (``keys``: sources it may not read)
        self._merged: dict[str, list[int]] = {k: [] for k in keys}
        for pos, (key, _) in enumerate(self.order):
            self._merged.setdefault(key, []).append(pos)
        self.sources = {
            key: FutureOrder(
                [self.order[p][1] for p in positions], lookahead=lookahead, active=active
            )
            for key, positions in self._merged.items()
        }

    def next_use(self, key: str, shard: int) -> float:
        """Merged positions until ``shard`` of ``key`` is read again (0 if being read, at
        least 1 for one its source has not read yet), ``inf`` if never."""
        source = self.sources.get(key)
        if source is None:
            return math.inf
        own = source.next_use(shard)
        if own == 0.0 or own == math.inf:
            return own
        at = self._merged[key][source.position + int(own) - 1]
        return float(max(1, at - self.position + 1))

    def advance(self, key: str, shard: int) -> None:
        """A read of ``shard`` of ``key``: its source moves on, and the merged clock to just
        past that read when it is the furthest yet."""
        source = self.sources.get(key)
        if source is None:
            return
        before = source.position
        source.advance(shard)
        if source.position != before:
            self.position = max(self.position, self._merged[key][source.position - 1] + 1)

    def shards(self, key: str) -> list[int]:
        """``key``'s part of the merged order."""
        source = self.sources.get(key)
        return list(source.order) if source is not None else []


@dataclass(frozen=True)
class Candidate:
    """A cached entry that could be evicted."""

    key: Hashable
    size: int
    last_used: float
    next_use: float = math.inf


def eviction_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Furthest next use first (never-again first of all); ties by least recently used."""
    return sorted(candidates, key=lambda c: (-c.next_use, c.last_used))


def lru_hits(order: Sequence[int], capacity: int) -> int:
    """Hits of an LRU cache holding ``capacity`` equal-size shards over ``order``."""
    held: dict[int, int] = {}
    hits = 0
    for t, s in enumerate(order):
        if s in held:
            hits += 1
        elif len(held) >= capacity:
            del held[min(held, key=held.__getitem__)]
        held[s] = t
    return hits


def belady_hits(order: Sequence[int], capacity: int) -> int:
    """Hits of Belady's MIN (the optimum for equal-size shards) over ``order``."""
    nxt = [math.inf] * len(order)
    last: dict[int, int] = {}
    for t in range(len(order) - 1, -1, -1):
        nxt[t] = last.get(order[t], math.inf)
        last[order[t]] = t
    held: dict[int, float] = {}
    hits = 0
    for t, s in enumerate(order):
        if s in held:
            hits += 1
        elif len(held) >= capacity:
            del held[max(held, key=held.__getitem__)]
        held[s] = nxt[t]
    return hits
