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
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "EpochPlan",
    "PlanOptions",
    "RankPlan",
    "Segment",
    "Topology",
    "locate",
    "node_samples",
    "node_shard_order",
    "plan_epoch",
    "rank_plan",
]

_SALT_NODES = 0x6E6F6465  # distinct RNG streams for each purpose
_SALT_EPOCH = 0x65706F63
_SALT_WINDOW = 0x77696E64


def _check_int(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


@dataclass(frozen=True)
class PlanOptions:
    """What the plan depends on besides the topology and the position.

    ``seed``: the run's seed (>= 0); ``shuffle``: permute shards and mix samples; ``window``:
    shard pieces whose samples are mixed together; ``drop_last``: drop the surplus that would
    make ranks unequal (else short ranks repeat samples).
    """

    seed: int = 0
    shuffle: bool = True
    window: int = 4
    drop_last: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", _check_int("seed", self.seed, low=0))
        object.__setattr__(self, "window", _check_int("window", self.window, low=1))
        object.__setattr__(self, "shuffle", _check_bool("shuffle", self.shuffle))
        object.__setattr__(self, "drop_last", _check_bool("drop_last", self.drop_last))

    def describe(self) -> str:
        return (
            f"seed {self.seed}, shuffle {self.shuffle}, window {self.window}, "
            f"drop_last {self.drop_last}"
        )


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks, ``ranks_per_node`` of them on each node (rank // rpn = node).

    ``ranks_per_node=None`` means one node; it is normalised, so two spellings of the same
    job compare equal: ``Topology(8) == Topology(8, 8)``.
    """

    world_size: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        ws = _check_int("world_size", self.world_size, low=1)
        rpn = ws if self.ranks_per_node is None else self.ranks_per_node
        rpn = _check_int("ranks_per_node", rpn, low=1)
        if ws % rpn:
            raise ValueError(f"ranks_per_node must divide world_size ({ws}), got {rpn}")
        object.__setattr__(self, "world_size", ws)
        object.__setattr__(self, "ranks_per_node", rpn)

    @property
    def rpn(self) -> int:
        return int(self.ranks_per_node or self.world_size)

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.rpn

    def node_of(self, rank: int) -> int:
        self.check_rank(rank)
        return rank // self.rpn

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")

    def check_node(self, node_rank: int) -> None:
        if not 0 <= node_rank < self.num_nodes:
            raise ValueError(f"node_rank must be in [0, {self.num_nodes}), got {node_rank}")

    def describe(self) -> str:
        return f"{self.world_size} ranks, {self.rpn} per node ({self.num_nodes} nodes)"


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch trained under one topology: each rank took ``samples_per_rank``."""

    world_size: int
    ranks_per_node: int | None
    samples_per_rank: int

    def __post_init__(self) -> None:
        topo = Topology(self.world_size, self.ranks_per_node)
        object.__setattr__(self, "ranks_per_node", topo.rpn)
        _check_int("samples_per_rank", self.samples_per_rank, low=0)

    @property
    def topology(self) -> Topology:
        return Topology(self.world_size, self.ranks_per_node)


@dataclass(frozen=True)
class RankPlan:
    """What one rank reads of one epoch (global sample ids, int64), and what its share drops
    (``drop_last``) or repeats (no ``drop_last``) so that every rank reads as many samples."""

    samples: np.ndarray
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    repeated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped_total: int = 0


@dataclass(frozen=True)
class EpochPlan:
    """The samples of every rank for one epoch: the whole epoch, for tests and small jobs."""

    per_rank: tuple[np.ndarray, ...]
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    repeated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def samples_per_rank(self) -> int:
        return len(self.per_rank[0]) if self.per_rank else 0

    def rank_samples(self, rank: int) -> np.ndarray:
        return self.per_rank[rank]


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, *keys])


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


def _cuts(length: int, parts: int) -> np.ndarray:
    """``parts`` equal contiguous parts of ``length``: their ``parts + 1`` boundaries."""
    return np.arange(parts + 1, dtype=np.int64) * length // parts


class _Chain:
    """Level 1: every shard's samples end to end in the stable, seeded shard order."""

    def __init__(self, sizes: np.ndarray, options: PlanOptions) -> None:
        self.sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])  # global id of a shard's row 0
        n = len(sizes)
        self.order = (
            _rng(options.seed, _SALT_NODES).permutation(n)
            if options.shuffle
            else np.arange(n, dtype=np.int64)
        )
        self.ends = np.cumsum(sizes[self.order])  # chain position after each shard in order
        self.total = int(self.offsets[-1])

    def pieces(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chain positions ``[lo, hi)`` as pieces of shards: (first global id, length, shard)."""
        if hi <= lo:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        first = int(np.searchsorted(self.ends, lo, side="right"))
        last = int(np.searchsorted(self.ends, hi - 1, side="right"))
        shard = self.order[first : last + 1]
        ends = self.ends[first : last + 1]
        starts = ends - self.sizes[shard]
        lo_c, hi_c = np.maximum(starts, lo), np.minimum(ends, hi)
        keep = hi_c > lo_c
        shard, starts, lo_c, hi_c = shard[keep], starts[keep], lo_c[keep], hi_c[keep]
        return self.offsets[shard] + (lo_c - starts), hi_c - lo_c, shard


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lengths)


@dataclass(frozen=True)
class _Stream:
    """A node's samples in epoch order, with the shard of each and the windows' bounds."""

    ids: np.ndarray
    shards: np.ndarray
    windows: np.ndarray  # start of each window in ``ids``, and its end last


def _node_stream(
    chain: _Chain, options: PlanOptions, epoch: int, num_nodes: int, node: int
) -> _Stream:
    """Level 2: the samples of ``node`` (of ``num_nodes``) in epoch order, whole epoch."""
    cuts = _cuts(chain.total, num_nodes)
    starts, lengths, shards = chain.pieces(int(cuts[node]), int(cuts[node + 1]))
    if not options.shuffle:
        ids = _ranges(starts, lengths)
        return _Stream(ids, np.repeat(shards, lengths), np.array([0, len(ids)], np.int64))
    order = _rng(options.seed, _SALT_EPOCH, epoch, node).permutation(len(starts))
    starts, lengths, shards = starts[order], lengths[order], shards[order]
    ids, per_sample = _ranges(starts, lengths), np.repeat(shards, lengths)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    windows = bounds[:: options.window]
    windows = np.concatenate([windows, [len(ids)]]) if windows[-1] != len(ids) else windows
    for k in range(len(windows) - 1):
        a, b = int(windows[k]), int(windows[k + 1])
        mix = _rng(options.seed, _SALT_WINDOW, epoch, node, k).permutation(b - a)
        ids[a:b], per_sample[a:b] = ids[a:b][mix], per_sample[a:b][mix]
    return _Stream(ids, per_sample, windows)


@dataclass(frozen=True)
class _Level:
    """One topology's view of what remains: a sequence of ``length`` samples cut into equal
    parts, one per node; ``consumed`` samples per rank were taken (a segment) or none."""

    topology: Topology
    length: int
    consumed: int = 0

    @property
    def cuts(self) -> np.ndarray:
        return _cuts(self.length, self.topology.num_nodes)

    def taken(self) -> np.ndarray:
        """Per node, the prefix of its part that its ranks consumed."""
        sizes = np.diff(self.cuts)
        return np.minimum(sizes, self.consumed * self.topology.rpn)

    def per_rank(self, drop_last: bool) -> int:
        """Samples every rank reads: the shortest rank's (drop_last) or the longest's."""
        sizes = np.diff(self.cuts)
        rpn = self.topology.rpn
        return int(sizes.min() // rpn) if drop_last else int(-(-sizes.max() // rpn))


class _Epoch:
    """What remains of one epoch after ``segments``, resolvable range by range."""

    def __init__(
        self,
        sizes: np.ndarray,
        options: PlanOptions,
        epoch: int,
        segments: Sequence[Segment],
        topology: Topology,
    ) -> None:
        self.options = options
        self.epoch = epoch
        self.chain = _Chain(sizes, options)
        self.levels: list[_Level] = []
        length = self.chain.total
        for seg in segments:
            level = _Level(seg.topology, length, seg.samples_per_rank)
            most = level.per_rank(options.drop_last)
            if seg.samples_per_rank > most:
                raise ValueError(
                    f"resume state says each rank consumed {seg.samples_per_rank} samples but "
                    f"the plan gave only {most}: the state belongs to another dataset"
                )
            self.levels.append(level)
            length -= int(level.taken().sum())
        self.current = _Level(topology, length)
        self._streams: dict[int, _Stream] = {}

    def _stream(self, node: int) -> _Stream:
        if node not in self._streams:
            num_nodes = (self.levels[0] if self.levels else self.current).topology.num_nodes
            self._streams[node] = _node_stream(
                self.chain, self.options, self.epoch, num_nodes, node
            )
        return self._streams[node]

    def resolve(self, lo: int, hi: int) -> np.ndarray:
        """Positions ``[lo, hi)`` of what remains, as global sample ids."""
        spans = [(lo, hi)] if hi > lo else []
        for level in reversed(self.levels):
            cuts, taken = level.cuts, level.taken()
            rest = np.diff(cuts) - taken
            after = np.concatenate([[0], np.cumsum(rest)])  # where each node's rest starts
            down = []
            for a, b in spans:
                j = int(np.searchsorted(after, a, side="right")) - 1
                while j < len(rest) and after[j] < b:
                    x, y = max(a, int(after[j])), min(b, int(after[j + 1]))
                    if y > x:
                        base = int(cuts[j] + taken[j] - after[j])
                        down.append((base + x, base + y))
                    j += 1
            spans = down
        first = self.levels[0] if self.levels else self.current
        cuts = first.cuts
        out = []
        for a, b in spans:
            j = int(np.searchsorted(cuts, a, side="right")) - 1
            while a < b:
                end = min(b, int(cuts[j + 1]))
                if end > a:
                    out.append(self._stream(j).ids[a - cuts[j] : end - cuts[j]])
                a = max(a, end)
                j += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def node_part(self, node: int) -> np.ndarray:
        cuts = self.current.cuts
        return self.resolve(int(cuts[node]), int(cuts[node + 1]))


def _epoch(
    shard_sizes: Sequence[int] | np.ndarray,
    options: PlanOptions,
    epoch: int,
    topology: Topology,
    segments: Sequence[Segment],
) -> tuple[_Epoch, int]:
    """The remaining epoch for ``topology`` and how many samples each rank skips: training
    that continues under the topology of the last segment continues that very sequence."""
    _check_int("epoch", epoch, low=0)
    skip = 0
    if segments and segments[-1].topology == topology:
        skip = segments[-1].samples_per_rank
        segments = segments[:-1]
        rest = _Epoch(_sizes(shard_sizes), options, epoch, segments, topology)
        most = rest.current.per_rank(options.drop_last)
        if skip > most:
            raise ValueError(
                f"resume state says each rank consumed {skip} samples but the plan gave only "
                f"{most}: the state belongs to another dataset"
            )
        return rest, skip
    return _Epoch(_sizes(shard_sizes), options, epoch, segments, topology), 0


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
    part = rest.node_part(node_rank)
    rpn = topology.rpn
    target = rest.current.per_rank(options.drop_last)
    # round-robin dealing: the first target * rpn samples are what the node's ranks read
    return part[skip * rpn : target * rpn]


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
        stream = rest._stream(node_rank)
        # its ranks read the first target * rpn samples (round-robin dealing)
        end = rest.current.per_rank(options.drop_last) * topology.rpn
        # a shard's samples all fall into one window: first needs are found window by window
        for a, b in zip(stream.windows[:-1], stream.windows[1:], strict=True):
            if a >= end:
                break
            uniq, first = np.unique(stream.shards[a : min(b, end)], return_index=True)
            order += uniq[np.argsort(first, kind="stable")].tolist()
    return order
