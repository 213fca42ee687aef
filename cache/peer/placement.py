"""Who fetches each shard from the store and who copies it from whom: the cluster warm's plan.

Pure and seeded: the input is each node's shards in need order (``NodeShare.order``) and what
every node already holds; the output names one store reader per shard nobody holds (a node
that needs it, the one with the fewest store reads so far, so the store's reads spread evenly)
and, for every other node that needs the shard, a source to copy it from, scheduled in waves
so that no node serves more than ``max_serving`` copies in one wave.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import xxhash

__all__ = ["Copy", "Placement", "place"]

Node = Hashable


@dataclass(frozen=True)
class Copy:
    """``target`` copies ``shard`` from ``source`` in wave ``wave`` (0: at once; a node that
    got a shard in wave w may serve it from wave w + 1)."""

    shard: int
    source: Node
    target: Node
    wave: int


@dataclass(frozen=True)
class Placement:
    """``store``: shard -> the node that reads it from the store (once per cluster);
    ``copies``: every peer-to-peer copy, in schedule order."""

    store: dict[int, Node] = field(default_factory=dict)
    copies: tuple[Copy, ...] = ()

    def store_reads(self) -> dict[Node, int]:
        """How many shards each node reads from the store."""
        out: dict[Node, int] = defaultdict(int)
        for node in self.store.values():
            out[node] += 1
        return dict(out)

    def sources(self, node: Node) -> dict[int, Node]:
        """Shard -> where ``node`` copies it from (its part of the placement)."""
        return {c.shard: c.source for c in self.copies if c.target == node}

    def waves(self) -> int:
        return 1 + max((c.wave for c in self.copies), default=-1)


def _tiebreak(seed: int, node: Node, shard: int) -> int:
    return xxhash.xxh3_64_intdigest(f"{seed}\x00{node!r}\x00{shard}")


def place(
    needs: Mapping[Node, Sequence[int]],
    held: Mapping[Node, Collection[int]] | None = None,
    *,
    max_serving: int = 4,
    seed: int = 0,
) -> Placement:
    """The placement of every shard some node needs and lacks (see the module docstring).

    ``needs[node]``: the shards ``node`` will read, in the order it first needs them
    (repeats are ignored); ``held[node]``: the shards it has already. Shards are placed in
    the order the cluster first needs them, and each shard's copies go first to the node
    that needs it soonest.
    """
    if isinstance(max_serving, bool) or not isinstance(max_serving, int) or max_serving < 1:
        raise ValueError(f"max_serving must be an integer >= 1, got {max_serving!r}")
    held = held or {}
    unknown = [n for n in held if n not in needs]
    position: dict[int, dict[Node, int]] = defaultdict(dict)  # shard -> node -> first need
    for node, order in needs.items():
        for at, shard in enumerate(order):
            if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
                raise ValueError(f"needs[{node!r}] holds {shard!r}: shards are integers >= 0")
            position[shard].setdefault(node, at)
    holders: dict[int, list[Node]] = defaultdict(list)
    for node in [*needs, *unknown]:
        for shard in held.get(node, ()):
            holders[int(shard)].append(node)
    # shards in the order the cluster needs them: by the earliest position any node needs it
    shards = sorted(position, key=lambda s: (min(position[s].values()), s))
    store: dict[int, Node] = {}
    copies: list[Copy] = []
    store_load: dict[Node, int] = defaultdict(int)
    served: dict[Node, int] = defaultdict(int)
    busy: dict[tuple[Node, int], int] = defaultdict(int)  # (node, wave) -> copies served
    first_open: dict[Node, int] = defaultdict(int)  # below it, every wave of the node is full
    for shard in shards:
        wanting = position[shard]
        have = {n: 0 for n in holders.get(shard, ())}  # holder -> first wave it may serve
        targets = sorted(
            (n for n in wanting if n not in have),
            key=lambda n: (wanting[n], _tiebreak(seed, n, shard)),
        )
        if not targets:
            continue
        if not have:
            fetcher = min(
                targets, key=lambda n: (store_load[n], wanting[n], _tiebreak(seed, n, shard))
            )
            store[shard] = fetcher
            store_load[fetcher] += 1
            have[fetcher] = 0  # it serves its fill while it runs (a fill in progress streams)
            targets.remove(fetcher)

        def key(source: Node, ready: int, shard: int = shard) -> tuple[int, int, int, int]:
            wave = max(ready, first_open[source])
            while busy[(source, wave)] >= max_serving:
                wave += 1
            return (wave, served[source], _tiebreak(seed, source, shard), ready)

        # the sources by (first wave with room, copies served, tie-break): the keys only grow
        # as copies are booked, so a popped key found stale is pushed back anew
        heap = [(*key(src, ready), n, src) for n, (src, ready) in enumerate(have.items())]
        heapq.heapify(heap)
        count = len(heap)
        for target in targets:
            while True:
                *stored, n, source = heapq.heappop(heap)
                actual = key(source, stored[3])
                if list(actual) == stored:
                    break
                heapq.heappush(heap, (*actual, n, source))
            wave = actual[0]
            busy[(source, wave)] += 1
            served[source] += 1
            while busy[(source, first_open[source])] >= max_serving:
                first_open[source] += 1
            copies.append(Copy(shard, source, target, wave))
            heapq.heappush(heap, (*key(source, stored[3]), n, source))
            heapq.heappush(heap, (*key(target, wave + 1), count, target))
            count += 1
    return Placement(store=store, copies=tuple(copies))
