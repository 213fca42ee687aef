"""The read plan: which samples each rank reads, in which order, every epoch.

A pure function of (shard sizes, ``PlanOptions``, epoch, ``Topology``, what was already
consumed): no I/O, identical on every rank. A rank computes only its own share: time and
memory grow with what its node reads plus a few arrays of one entry per shard, never with
the whole epoch (10^9 samples in 10^6 shards on 8,192 ranks is the design point). The loader,
the cache's read-ahead and eviction, and ``cache warm`` all use it.

Two levels:

1. Node split, stable across epochs. Shards are laid end to end in a seeded order that does
   not depend on the epoch (the natural order without ``shuffle``), and that chain of samples
   is cut into ``num_nodes`` contiguous, equal parts. A node keeps the same shards every epoch
   (its cache keeps hitting); at most ``num_nodes - 1`` shards are shared by two neighbours.
2. Epoch order inside a node. The node's shard pieces are permuted per epoch, grouped into
   windows of ``window`` pieces, and the samples of each window are shuffled together: mixing
   across several shards, not only inside one. The node's stream is dealt round-robin to its
   ranks, so ranks of one node read the same window at the same time (one fetch per node).

Every rank gets the same number of samples: with ``drop_last`` the surplus (fewer than
``world_size`` samples) is dropped and named; without it, short ranks repeat samples of their
own stream.

Resume. Ranks advance in lock-step, so "each rank consumed k samples under topology T" (a
``Segment``) describes the whole job. Round-robin dealing means the k samples of each of a
node's ranks are exactly the first ``k * ranks_per_node`` samples of that node's stream. What
remains of an epoch is therefore a sequence: the unread suffixes of the nodes' streams, node
after node. A new topology cuts that sequence into equal parts, one per node, and deals each
part round-robin again. Each later segment does the same to what the previous one left, so a
rank resolves its part through the segments down to a few node streams of the first topology:
no per-sample set over the dataset is ever built. The resume state is a list of segments,
three integers each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from flashfeed.plan.streams import _Chain, _Epoch, _Level
from flashfeed.plan.types import EpochPlan, PlanOptions, RankPlan, Segment, Topology, check_int

__all__ = [
    "EpochPlan",
    "PlanOptions",
    "RankPlan",
    "Segment",
    "Topology",
    "deal",
    "epoch_sequence",
    "locate",
    "node_samples",
    "node_shard_order",
    "plan_epoch",
    "rank_plan",
]


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


def _epoch(
    shard_sizes: Sequence[int] | np.ndarray,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
    segments: Sequence[Segment],
    chain: _Chain | None = None,
) -> tuple[_Epoch, int]:
    """The remaining epoch for ``topology`` and how many samples each rank skips: training
    that continues under the topology of the last segment continues that very sequence.
    ``chain``: the dataset's level 1, built once by a caller that plans many epochs (its
    sizes are then not checked again)."""
    check_int("epoch", epoch, low=0)
    sizes = chain.sizes if chain is not None else _sizes(shard_sizes)
    skip = 0
    if segments and segments[-1].topology == topology:
        skip = segments[-1].samples_per_rank
        segments = segments[:-1]
        rest = _Epoch(sizes, options, epoch, segments, topology, chain)
        most = rest.current.per_rank(options.drop_last)
        if skip > most:
            raise ValueError(
                f"resume state says each rank consumed {skip} samples but the plan gave only "
                f"{most}: the state belongs to another dataset"
            )
        return rest, skip
    return _Epoch(sizes, options, epoch, segments, topology, chain), 0


def _equalise(mine: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(samples, dropped, repeated) of one rank cut or padded to ``target``."""
    empty = np.zeros(0, np.int64)
    if len(mine) >= target:
        return mine[:target], mine[target:], empty
    if len(mine) == 0:
        raise ValueError("a rank has no samples at all; use fewer ranks or more data")
    extra = np.resize(mine, target - len(mine))
    return np.concatenate([mine, extra]), empty, extra


def rank_plan(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
    rank: int,
    segments: Sequence[Segment] = (),
) -> RankPlan:
    """What ``rank`` still reads of ``epoch``, in order, after ``segments`` were trained.

    Costs what the rank's node reads plus a few arrays of one entry per shard.

    >>> p = rank_plan([3, 3, 4], options=PlanOptions(), epoch=0, topology=Topology(2), rank=1)
    >>> len(p.samples)
    5
    """
    topology.check_rank(rank)
    rest, skip = _epoch(shard_sizes, options, epoch, topology, segments)
    return _rank_plan(rest, skip, options, topology, rank)


def _rank_plan(
    rest: _Epoch, skip: int, options: PlanOptions, topology: Topology, rank: int
) -> RankPlan:
    """``rank_plan`` of an epoch already resolved by ``_epoch``."""
    rpn = topology.rpn
    part = rest.node_part(rank // rpn)
    level = rest.current
    target = level.per_rank(options.drop_last)
    samples, dropped, repeated = _equalise(part[rank % rpn :: rpn], target)
    dropped_total = int(level.length - target * topology.world_size) if options.drop_last else 0
    return RankPlan(samples[skip:], dropped, repeated, dropped_total)


def node_samples(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
    node_rank: int,
    segments: Sequence[Segment] = (),
) -> np.ndarray:
    """The samples one node's ranks still read of ``epoch``, in the order the node needs them
    (its ranks advance in lock-step, so position by position across its ranks)."""
    topology.check_node(node_rank)
    rest, skip = _epoch(shard_sizes, options, epoch, topology, segments)
    return _node_samples(rest, skip, options, topology, node_rank)


def _node_samples(
    rest: _Epoch, skip: int, options: PlanOptions, topology: Topology, node_rank: int
) -> np.ndarray:
    """``node_samples`` of an epoch already resolved by ``_epoch``."""
    part = rest.node_part(node_rank)
    rpn = topology.rpn
    target = rest.current.per_rank(options.drop_last)
    # round-robin dealing: the first target * rpn samples are what the node's ranks read
    return part[skip * rpn : target * rpn]


def epoch_sequence(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
) -> np.ndarray:
    """The whole of ``epoch`` as one sequence: the node parts of ``topology`` end to end,
    each in its node's order (``deal`` cuts it back into the same rank plans). It costs the
    whole epoch: for a resume whose remainder is not a prefix of every node's stream
    (aspect-ratio buckets deliver out of plan order), not for a training rank's own plan."""
    rest, _ = _epoch(shard_sizes, options, epoch, topology, ())
    return rest.resolve(0, rest.current.length)


def deal(sequence: np.ndarray, *, topology: Topology, rank: int, drop_last: bool) -> RankPlan:
    """``rank``'s share of ``sequence`` (what remains of an epoch, in order), cut the way the
    plan cuts what remains: equal contiguous parts per node, dealt round-robin to its ranks,
    cut or padded so every rank reads as many samples (``drop_last``).

    >>> seq = epoch_sequence([3, 3, 4], options=PlanOptions(), epoch=0, topology=Topology(2))
    >>> p = rank_plan([3, 3, 4], options=PlanOptions(), epoch=0, topology=Topology(2), rank=1)
    >>> bool(np.array_equal(deal(seq, topology=Topology(2), rank=1, drop_last=True).samples,
    ...                     p.samples))
    True
    """
    topology.check_rank(rank)
    level = _Level(topology, len(sequence))
    cuts, rpn = level.cuts, topology.rpn
    node = rank // rpn
    part = np.asarray(sequence, np.int64)[int(cuts[node]) : int(cuts[node + 1])]
    target = level.per_rank(drop_last)
    samples, dropped, repeated = _equalise(part[rank % rpn :: rpn], target)
    dropped_total = int(level.length - target * topology.world_size) if drop_last else 0
    return RankPlan(samples, dropped, repeated, dropped_total)


def plan_epoch(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
    segments: Sequence[Segment] = (),
) -> EpochPlan:
    """The plan of one epoch for every rank: the whole epoch in memory, for tests, analysis
    and small jobs. A training rank uses ``rank_plan``.

    >>> p = plan_epoch([3, 3, 4], options=PlanOptions(), epoch=0, topology=Topology(2))
    >>> p.samples_per_rank, sorted(np.concatenate(p.per_rank).tolist())
    (5, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """
    rest, skip = _epoch(shard_sizes, options, epoch, topology, segments)
    target = rest.current.per_rank(options.drop_last)
    rpn = topology.rpn
    per_rank, dropped, repeated = [], [], []
    for node in range(topology.num_nodes):
        part = rest.node_part(node)
        for r in range(rpn):
            samples, d, e = _equalise(part[r::rpn], target)
            per_rank.append(samples[skip:])
            dropped.append(d)
            repeated.append(e)
    return EpochPlan(
        per_rank=tuple(per_rank),
        dropped=np.concatenate(dropped) if dropped else np.zeros(0, np.int64),
        repeated=np.concatenate(repeated) if repeated else np.zeros(0, np.int64),
    )


def node_shard_order(
    shard_sizes: Sequence[int] | np.ndarray,
    *,
    options: PlanOptions,
    epochs: Iterable[int],
    topology: Topology,
    node_rank: int = 0,
) -> list[int]:
    """The shards one node reads, in the order it first needs each, epoch after epoch (with
    repeats across epochs): what ``cache warm`` fetches and what eviction looks ahead at."""
    topology.check_node(node_rank)
    order: list[int] = []
    for epoch in epochs:
        rest, _ = _epoch(shard_sizes, options, epoch, topology, ())
        stream = rest.stream(node_rank)
        # its ranks read the first target * rpn samples (round-robin dealing)
        end = rest.current.per_rank(options.drop_last) * topology.rpn
        # a shard's samples all fall into one window: first needs are found window by window
        for a, b in zip(stream.windows[:-1], stream.windows[1:], strict=True):
            if a >= end:
                break
            uniq, first = np.unique(stream.shards[a : min(b, end)], return_index=True)
            order += uniq[np.argsort(first, kind="stable")].tolist()
    return order
