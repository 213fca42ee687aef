"""How the plan is computed: the stable chain of shards (level 1), a node's stream of one
epoch (level 2), and what remains of an epoch after resume segments, resolved range by range
down to the node streams of the first topology (see ``flashfeed.plan.plan``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flashfeed.plan.types import PlanOptions, Segment, Topology

__all__: list[str] = []

_SALT_NODES = 0x6E6F6465  # distinct RNG streams for each purpose
_SALT_EPOCH = 0x65706F63
_SALT_WINDOW = 0x77696E64


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, *keys])


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
        sliced = k == 0 or options.arrival_windows == "all"
        if sliced and epoch == 0 and options.arrival_slices > 1:
            lo, hi = int(np.searchsorted(bounds, a)), int(np.searchsorted(bounds, b))
            part = _slices(lengths[lo:hi], options.arrival_slices, options.arrival_spacing)
            mix = mix[np.argsort(part[mix], kind="stable")]
        ids[a:b], per_sample[a:b] = ids[a:b][mix], per_sample[a:b][mix]
    return _Stream(ids, per_sample, windows)


def _slices(lengths: np.ndarray, slices: int, spacing: str = "even") -> np.ndarray:
    """For each sample of pieces of ``lengths`` laid end to end, which of ``slices``
    front-to-back parts of its piece holds it: a stable sort by it, after the window's
    shuffle, makes the first batches read the first part of every piece, the bytes that
    land first. ``"even"``: equal parts; ``"doubling"``: part ``j > 0`` ends at
    ``2**(j - slices + 1)`` of the piece (the back half last), part 0 is the rest of the front."""
    within = _ranges(np.zeros(len(lengths), np.int64), lengths)
    per = np.repeat(np.maximum(lengths, 1), lengths)
    if spacing == "even":
        return within * slices // per
    # the part is slices - 1 less the halvings k of the piece that still end past the
    # sample: within < per / 2**k, in integers within < ceil(per / 2**k) (no overflow)
    halvings = np.zeros(len(within), np.int64)
    for k in range(1, min(slices, 63)):
        halvings += within < -((-per) >> k)
    if slices > 63:  # beyond 2**62 only the first sample of a piece is in front
        halvings += (slices - 63) * (within == 0)
    return slices - 1 - halvings


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
        """Samples every rank reads: the shortest rank's (drop_last) or the longest's. The
        parts of ``cuts`` are ``length // nodes`` long or one more (Python ints, no arrays)."""
        nodes, rpn = self.topology.num_nodes, self.topology.rpn
        if drop_last:
            return (self.length // nodes) // rpn
        longest = -(-self.length // nodes)
        return -(-longest // rpn)


class _Epoch:
    """What remains of one epoch after ``segments``, resolvable range by range."""

    def __init__(
        self,
        sizes: np.ndarray,
        options: PlanOptions,
        epoch: int,
        segments: Sequence[Segment],
        topology: Topology,
        chain: _Chain | None = None,
    ) -> None:
        self.options = options
        self.epoch = epoch
        # the chain depends only on the sizes and the options: a caller planning many
        # epochs of one dataset builds it once and passes it in
        self.chain = _Chain(sizes, options) if chain is None else chain
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

    def stream(self, node: int) -> _Stream:
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
                    out.append(self.stream(j).ids[a - cuts[j] : end - cuts[j]])
                a = max(a, end)
                j += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def node_part(self, node: int) -> np.ndarray:
        cuts = self.current.cuts
        return self.resolve(int(cuts[node]), int(cuts[node + 1]))
