"""The values the plan takes and gives: ``PlanOptions``, ``Topology`` and ``Segment`` in,
``RankPlan`` and ``EpochPlan`` out, each checked once where it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ARRIVAL_SPACINGS",
    "ARRIVAL_WINDOWS",
    "EpochPlan",
    "PlanOptions",
    "RankPlan",
    "Segment",
    "Topology",
    "check_int",
]

#: how the first window's arrival slices are spaced (``PlanOptions.arrival_spacing``)
ARRIVAL_SPACINGS = ("doubling", "even")
#: which windows of the first epoch are read in arrival slices (``PlanOptions.arrival_windows``)
ARRIVAL_WINDOWS = ("all", "first")


def check_int(name: str, value: object, *, low: int) -> int:
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
    make ranks unequal (else short ranks repeat samples); ``arrival_slices``: the first epoch's
    windows are served front to back in this many slices of each shard piece, shuffled
    inside each slice, so a window's first batches need only the first bytes of each of its
    shards to arrive from storage (1 = the plain window shuffle, the order of states saved
    before this option); ``arrival_windows``: which windows of the first epoch are sliced,
    ``"first"`` (only window 0; later windows shuffled whole: the default, and the order of
    states saved before this option) or ``"all"`` (a cold epoch never waits for a whole
    window to land: only the last slice of the last window is read after its bytes landed;
    but on shards sorted by class inside, every window then mixes as little as the first,
    so it is opt-in);
    ``arrival_spacing``: where the slices end. ``"doubling"``: each slice is as long as all
    before it (the first ``1/2**(n-1)`` of the piece, then up to twice that, ..., the back
    half last), so the first batches need only the very front while most of the window still
    mixes over half its pieces; ``"even"``: equal slices (states saved before this option).
    """

    seed: int = 0
    shuffle: bool = True
    window: int = 4
    drop_last: bool = True
    arrival_slices: int = 8
    arrival_spacing: str = "doubling"
    arrival_windows: str = "first"

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_int("seed", self.seed, low=0))
        object.__setattr__(self, "window", check_int("window", self.window, low=1))
        slices = check_int("arrival_slices", self.arrival_slices, low=1)
        object.__setattr__(self, "arrival_slices", slices)
        if self.arrival_spacing not in ARRIVAL_SPACINGS:
            raise ValueError(
                f"arrival_spacing must be one of {ARRIVAL_SPACINGS}, got {self.arrival_spacing!r}"
            )
        if self.arrival_windows not in ARRIVAL_WINDOWS:
            raise ValueError(
                f"arrival_windows must be one of {ARRIVAL_WINDOWS}, got {self.arrival_windows!r}"
            )
        object.__setattr__(self, "shuffle", _check_bool("shuffle", self.shuffle))
        object.__setattr__(self, "drop_last", _check_bool("drop_last", self.drop_last))

    def describe(self) -> str:
        return (
            f"seed {self.seed}, shuffle {self.shuffle}, window {self.window}, "
            f"drop_last {self.drop_last}, arrival_slices {self.arrival_slices} "
            f"({self.arrival_spacing}, {self.arrival_windows} windows)"
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
        ws = check_int("world_size", self.world_size, low=1)
        rpn = ws if self.ranks_per_node is None else self.ranks_per_node
        rpn = check_int("ranks_per_node", rpn, low=1)
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
        check_int("samples_per_rank", self.samples_per_rank, low=0)

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
