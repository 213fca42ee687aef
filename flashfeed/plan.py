"""The read plan: which samples each rank reads, in which order, every epoch.

A pure function of (shard sizes, seed, epoch, topology, what was already consumed): no I/O,
identical on every rank, cheap enough for 100,000 shards. The loader, the cache's read-ahead
and eviction, and ``cache warm`` all use it.

Two levels:

1. Node split, stable across epochs. Shards are concatenated in a seeded order that does not
   depend on the epoch and cut into ``num_nodes`` contiguous, equal ranges of samples. A node
   keeps the same shards every epoch (its cache keeps hitting); at most ``num_nodes - 1``
   shards are shared by two neighbouring nodes.
2. Epoch order inside a node. The node's shard pieces are permuted per epoch, grouped into
   windows of ``window`` pieces, and the samples of each window are shuffled together: mixing
   across several shards, not only inside one. The node's stream is dealt round-robin to its
   ranks, so ranks of one node read the same window at the same time (one fetch per node).

Every rank gets the same number of samples: with ``drop_last`` the few surplus samples
(fewer than ``world_size``) are dropped and listed; without it, short ranks repeat samples
of their own stream. Resume under a new world size re-plans only the samples that were not
consumed: a ``Segment`` records each stretch of training under one topology.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "EpochPlan",
    "Segment",
    "Topology",
    "consumed_mask",
    "locate",
    "node_shard_order",
    "plan_epoch",
]

_SALT_NODES = 0x6E6F6465  # distinct RNG streams for each purpose
_SALT_EPOCH = 0x65706F63
_SALT_WINDOW = 0x77696E64


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks, ``ranks_per_node`` of them on each node (rank // rpn = node)."""

    world_size: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        rpn = self.ranks_per_node
        if rpn is not None and (rpn < 1 or self.world_size % rpn):
            raise ValueError(
                f"ranks_per_node must divide world_size ({self.world_size}), got {rpn}"
            )

    @property
    def rpn(self) -> int:
        return self.ranks_per_node or self.world_size

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.rpn

    def node_of(self, rank: int) -> int:
        self.check_rank(rank)
        return rank // self.rpn

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch trained under one topology: each rank took ``samples_per_rank``."""

    world_size: int
    ranks_per_node: int | None
    samples_per_rank: int

    @property
    def topology(self) -> Topology:
        return Topology(self.world_size, self.ranks_per_node)


@dataclass(frozen=True)
class EpochPlan:
    """The samples of every rank for one epoch (global sample ids, int64)."""

    per_rank: tuple[np.ndarray, ...]
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    repeated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def samples_per_rank(self) -> int:
        return len(self.per_rank[0]) if self.per_rank else 0

    def rank_samples(self, rank: int) -> np.ndarray:
        return self.per_rank[rank]


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, *keys])


def _sizes(shard_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any():
        raise ValueError("shard_sizes must be a 1-D sequence of sample counts >= 0")
    return sizes


def locate(
    shard_sizes: Sequence[int] | np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Global sample ids -> (shard index, index inside the shard)."""
    offsets = np.concatenate([[0], np.cumsum(_sizes(shard_sizes))])
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return shard, ids - offsets[shard]


def _node_ranges(
    sizes: np.ndarray, seed: int, available: np.ndarray, num_nodes: int
) -> list[np.ndarray]:
    """Level 1: the available sample ids of each node, shard-major, stable across epochs."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shuffle_order = _rng(seed, _SALT_NODES).permutation(len(sizes))
    lengths = sizes[shuffle_order]
    out_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
    # each shard's ids laid end to end in the shuffled order, without a Python loop
    chain = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
        offsets[shuffle_order] - out_starts, lengths
    )
    chain = chain[available[chain]]
    bounds = [len(chain) * j // num_nodes for j in range(num_nodes + 1)]
    return [chain[bounds[j] : bounds[j + 1]] for j in range(num_nodes)]


def _node_stream(
    ids: np.ndarray,
    sizes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    node: int,
    window: int,
    shuffle: bool,
) -> np.ndarray:
    """Level 2: a node's samples in epoch order: pieces permuted, windows mixed."""
    if not shuffle or len(ids) == 0:
        return np.sort(ids)
    shard, _ = locate(sizes, ids)
    # ids are shard-major: the pieces are the runs of equal shard index
    starts = np.flatnonzero(np.diff(shard, prepend=-1))
    pieces = np.split(ids, starts[1:])
    order = _rng(seed, _SALT_EPOCH, epoch, node).permutation(len(pieces))
    out = []
    for w, first in enumerate(range(0, len(order), window)):
        chunk = np.concatenate([pieces[p] for p in order[first : first + window]])
        out.append(_rng(seed, _SALT_WINDOW, epoch, node, w).permutation(chunk))
    return np.concatenate(out)


def _plan_available(
    sizes: np.ndarray,
    available: np.ndarray,
    *,
    seed: int,
    epoch: int,
    topology: Topology,
    window: int,
    shuffle: bool,
    drop_last: bool,
) -> EpochPlan:
    rpn = topology.rpn
    streams = []
    for node, ids in enumerate(_node_ranges(sizes, seed, available, topology.num_nodes)):
        stream = _node_stream(
            ids, sizes, seed=seed, epoch=epoch, node=node, window=window, shuffle=shuffle
        )
        streams += [stream[r::rpn] for r in range(rpn)]
    lengths = [len(s) for s in streams]
    target = min(lengths) if drop_last else max(lengths)
    per_rank, dropped, repeated = [], [], []
    for s in streams:
        if len(s) >= target:
            per_rank.append(s[:target])
            dropped.append(s[target:])
        else:
            extra = np.resize(s, target - len(s)) if len(s) else np.zeros(0, np.int64)
            if len(s) == 0 and target:
                raise ValueError("a rank has no samples at all; use fewer ranks or more data")
            per_rank.append(np.concatenate([s, extra]))
            repeated.append(extra)
    return EpochPlan(
        per_rank=tuple(per_rank),
        dropped=np.concatenate(dropped) if dropped else np.zeros(0, np.int64),
        repeated=np.concatenate(repeated) if repeated else np.zeros(0, np.int64),
    )


def consumed_mask(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    segments: Sequence[Segment] = (),
    window: int = 4,
    shuffle: bool = True,
    drop_last: bool = True,
) -> np.ndarray:
    """Boolean mask over all samples: True where consumed by the given segments."""
    sizes = _sizes(shard_sizes)
    consumed = np.zeros(int(sizes.sum()), dtype=bool)
    for seg in segments:
        plan = _plan_available(
            sizes,
            ~consumed,
            seed=seed,
            epoch=epoch,
            topology=seg.topology,
            window=window,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        if seg.samples_per_rank > plan.samples_per_rank:
            raise ValueError(
                f"resume state says each rank consumed {seg.samples_per_rank} samples but the "
                f"plan gave only {plan.samples_per_rank}: the state belongs to another dataset"
            )
        for ids in plan.per_rank:
            consumed[ids[: seg.samples_per_rank]] = True
    return consumed


def plan_epoch(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    world_size: int = 1,
    ranks_per_node: int | None = None,
    window: int = 4,
    shuffle: bool = True,
    drop_last: bool = True,
    segments: Sequence[Segment] = (),
) -> EpochPlan:
    """The plan of one epoch for every rank.

    ``segments`` are the stretches of this epoch already trained (from a resume state): their
    samples are excluded and only the rest is split over the given topology.

    >>> p = plan_epoch([3, 3, 4], seed=0, epoch=0, world_size=2)
    >>> p.samples_per_rank, sorted(np.concatenate(p.per_rank).tolist())
    (5, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    sizes = _sizes(shard_sizes)
    topology = Topology(world_size, ranks_per_node)
    skip = 0
    if segments and segments[-1].topology == topology:
        # same topology as before the interruption: continue the very same sequence
        skip = segments[-1].samples_per_rank
        segments = segments[:-1]
    available = ~consumed_mask(
        sizes,
        seed=seed,
        epoch=epoch,
        segments=segments,
        window=window,
        shuffle=shuffle,
        drop_last=drop_last,
    )
    plan = _plan_available(
        sizes,
        available,
        seed=seed,
        epoch=epoch,
        topology=topology,
        window=window,
        shuffle=shuffle,
        drop_last=drop_last,
    )
    if skip > plan.samples_per_rank:
        raise ValueError(
            f"resume state says each rank consumed {skip} samples but the plan gave only "
            f"{plan.samples_per_rank}: the state belongs to another dataset"
        )
    if skip:
        plan = EpochPlan(tuple(r[skip:] for r in plan.per_rank), plan.dropped, plan.repeated)
    return plan


def node_shard_order(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epochs: Iterable[int],
    world_size: int = 1,
    ranks_per_node: int | None = None,
    node_rank: int = 0,
    window: int = 4,
    shuffle: bool = True,
    drop_last: bool = True,
) -> list[int]:
    """The shards one node reads, in the order it first needs each, over the given epochs
    (with repeats across epochs): what ``cache warm`` fetches and what eviction looks ahead at.
    """
    topology = Topology(world_size, ranks_per_node)
    if not 0 <= node_rank < topology.num_nodes:
        raise ValueError(f"node_rank must be in [0, {topology.num_nodes}), got {node_rank}")
    sizes = _sizes(shard_sizes)
    order: list[int] = []
    for epoch in epochs:
        plan = plan_epoch(
            sizes,
            seed=seed,
            epoch=epoch,
            world_size=world_size,
            ranks_per_node=ranks_per_node,
            window=window,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        ranks = range(node_rank * topology.rpn, (node_rank + 1) * topology.rpn)
        # ranks of a node advance in lock-step: interleave their streams position by position
        stacked = np.stack([plan.per_rank[r] for r in ranks], axis=1).reshape(-1)
        shards, _ = locate(sizes, stacked)
        seen: set[int] = set()
        for s in shards.tolist():
            if s not in seen:
                seen.add(s)
                order.append(s)
    return order
