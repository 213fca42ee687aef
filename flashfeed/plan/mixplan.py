"""The read plan of a mixture: which sample of which source each rank reads, in order.

Pure and rank-local, like ``flashfeed.plan.plan``, on which it is built:

- Each source keeps its own plan (``rank_plan`` over its shard sizes, with a seed derived
  from the run's seed and the source's digest): its own shard order, windows and node
  affinity. A source read more often than its plan is long is read again in a fresh
  permutation (a new *cycle*, planned as source epoch ``epoch * 2**32 + cycle``); one read
  less is read as a prefix of its order: sampled without replacement.
- ``flashfeed.plan.mixdeal`` deals a rank's slots to sources by weight. The deal does not depend
  on the rank: all ranks read the same number of samples of each source, in lock-step.
- So a source's place in an epoch is a ``Cursor``: its cycle and the ``Segment`` values
  of that cycle already trained, today's elastic-resume state per source. A deal runs under
  one topology and one mixture; a new world size or new weights start a new deal from the
  cursors where the last one stopped, so each source's rest is re-split exactly once.

Positions are global sample counts: the schedule's clock is the samples trained since the
start of epoch 0 (every rank together); an epoch of ``length`` samples deals
``length // world_size`` slots per rank. Samples are named by virtual ids: the sources' ids
laid end to end in the mixture's order (``MixPlanner.offsets``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from flashfeed.plan.mixdeal import WeightCurve, deal_order
from flashfeed.plan.mixture import Mixture
from flashfeed.plan.plan import (
    PlanOptions,
    Segment,
    Topology,
    _epoch,
    _node_samples,
    _rank_plan,
    _sizes,
)
from flashfeed.plan.streams import _Chain, _Epoch

__all__ = ["Cursor", "MixPlanner", "MixProgress", "MixRankPlan", "SourceTable"]

_SALT_PHASE = 0x70686173
CYCLE = 1 << 32  # source epoch of (epoch, cycle): epoch * CYCLE + cycle


@dataclass(frozen=True)
class SourceTable:
    """What the plan needs of one source: its name, its dataset's digest, its shard sizes."""

    name: str
    digest: str
    sizes: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class Cursor:
    """One source's place in an epoch: its cycle, and what of it was trained (segments)."""

    cycle: int = 0
    segments: tuple[Segment, ...] = ()


@dataclass(frozen=True)
class MixProgress:
    """Where a job stands in one epoch of a mixture: the deal it is in (started after
    ``start`` samples of the epoch, under ``topology`` and the mixture of digest ``mixture``,
    each source at ``cursors``) and the slots per rank ``consumed`` of that deal.
    ``epoch_start``: samples trained before this epoch (the schedule's clock)."""

    epoch: int
    epoch_start: int
    start: int
    topology: Topology
    cursors: tuple[tuple[str, Cursor], ...]
    mixture: str
    consumed: int = 0

    def cursor(self, name: str) -> Cursor:
        return dict(self.cursors).get(name, Cursor())


@dataclass(frozen=True)
class MixRankPlan:
    """What one rank still reads of a deal: virtual sample ids and the source of each."""

    samples: np.ndarray
    sources: np.ndarray


def _derived_seed(seed: int, digest: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{digest}".encode()).digest()[:8], "big") >> 1


def _merge(segments: tuple[Segment, ...], topology: Topology, k: int) -> tuple[Segment, ...]:
    """``segments`` after each rank took ``k`` more samples under ``topology``."""
    if segments and segments[-1].topology == topology:
        last = segments[-1]
        return (*segments[:-1], replace(last, samples_per_rank=last.samples_per_rank + k))
    return (*segments, Segment(topology.world_size, topology.rpn, k))


class MixPlanner:
    """The plan of one mixture over its sources' shard tables (no I/O).

    ``tables`` are in the mixture's source order. Deals are memoised: a rank asking again
    for the same deal (after consuming some of it) costs an array slice.
    """

    def __init__(self, mixture: Mixture, tables: Sequence[SourceTable], options: PlanOptions):
        names = [t.name for t in tables]
        if names != list(mixture.names):
            raise ValueError(f"source tables {names} do not match the mixture's {mixture.names}")
        self.mixture = mixture
        self.digest = mixture.digest  # hashed once: deals and progress compare it
        self.tables = tuple(tables)
        self.options = options
        self.curve = WeightCurve(*mixture.knots())
        totals = np.array([int(np.asarray(t.sizes).sum()) for t in tables], dtype=np.int64)
        for t, n in zip(tables, totals, strict=True):
            if n == 0:
                raise ValueError(f"source {t.name!r} has no samples")
        self.totals = totals
        self.offsets = np.concatenate([[0], np.cumsum(totals)])
        counts = np.array([len(t.sizes) for t in tables], dtype=np.int64)
        self.shard_offsets = np.concatenate([[0], np.cumsum(counts)])
        self.src_options = tuple(
            replace(options, seed=_derived_seed(options.seed, t.digest)) for t in tables
        )
        self.index = {t.name: i for i, t in enumerate(tables)}
        # a deal: its labels, and the pick of each slot (``deal_order``)
        self._deals: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._lengths: dict[tuple[object, ...], int] = {}
        self._chains: dict[int, _Chain] = {}

    # -- sources -------------------------------------------------------------------------

    def _epoch(
        self, s: int, epoch: int, cycle: int, topology: Topology, segments: tuple[Segment, ...]
    ) -> tuple[_Epoch, int]:
        """``plan._epoch`` of source ``s``'s cycle over its shard chain, which depends on
        neither the epoch nor the cycle: built once, not once per cycle."""
        try:
            if s not in self._chains:
                self._chains[s] = _Chain(_sizes(self.tables[s].sizes), self.src_options[s])
            return _epoch(self.tables[s].sizes, self.src_options[s], epoch * CYCLE + cycle,
                          topology, segments, self._chains[s])  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"source {self.tables[s].name!r}: {exc}") from None

    def cycle_plan(
        self,
        s: int,
        epoch: int,
        cycle: int,
        topology: Topology,
        rank: int,
        segments: tuple[Segment, ...] = (),
    ) -> np.ndarray:
        """Source ``s``'s own ids that ``rank`` still reads of cycle ``cycle``."""
        options = self.src_options[s]
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        if segments and not options.drop_last and rest.current.length < topology.world_size:
            # without drop_last, a cycle's rest smaller than the new world size cannot
            # reach every rank: that stretch of the cycle is skipped, never read twice
            return np.zeros(0, np.int64)
        try:
            plan = _rank_plan(rest, skip, options, topology, rank)
        except ValueError as exc:
            raise ValueError(f"source {self.tables[s].name!r}: {exc}") from None
        return plan.samples

    def _cycle_len(
        self, s: int, epoch: int, cycle: int, topology: Topology, segments: tuple[Segment, ...] = ()
    ) -> int:
        key = (s, epoch, cycle, topology, segments)
        if key not in self._lengths:
            self._lengths[key] = self._count(s, epoch, cycle, topology, segments)
        return self._lengths[key]

    def _count(
        self, s: int, epoch: int, cycle: int, topology: Topology, segments: tuple[Segment, ...]
    ) -> int:
        """``len(cycle_plan(...))``, the same on every rank, without planning a rank."""
        options = self.src_options[s]
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        if segments and not options.drop_last and rest.current.length < topology.world_size:
            return 0  # the stretch cycle_plan skips
        return max(rest.current.per_rank(options.drop_last) - skip, 0)

    def _full_len(self, s: int, topology: Topology) -> int:
        """Samples per rank of a whole cycle of source ``s`` (the same in every cycle)."""
        n = self._cycle_len(s, 0, 0, topology)
        if n == 0:
            raise ValueError(
                f"source {self.tables[s].name!r} has too few samples "
                f"({self.totals[s]}) for {topology.world_size} ranks"
            )
        return n

    def advance(self, cursor: Cursor, s: int, epoch: int, topology: Topology, k: int) -> Cursor:
        """Source ``s``'s cursor after each rank read ``k`` more of its samples."""
        if k == 0:
            return cursor
        rest = self._cycle_len(s, epoch, cursor.cycle, topology, cursor.segments)
        if k < rest:
            return Cursor(cursor.cycle, _merge(cursor.segments, topology, k))
        full, part = divmod(k - rest, self._full_len(s, topology))
        segs = (Segment(topology.world_size, topology.rpn, part),) if part else ()
        return Cursor(cursor.cycle + 1 + full, segs)

    def source_picks(
        self,
        s: int,
        cursor: Cursor,
        epoch: int,
        topology: Topology,
        rank: int,
        lo: int,
        hi: int,
        *,
        node: bool = False,
    ) -> np.ndarray:
        """Source ``s``'s own ids of ``rank``'s picks ``[lo, hi)`` of a deal from ``cursor``;
        with ``node``, of every rank of node ``rank``: one row per pick, one column per rank.
        """
        out, pos, cycle, segs = [], 0, cursor.cycle, cursor.segments
        while pos < hi:
            key = (s, epoch, cycle, topology, segs)
            if not node and pos >= lo and key not in self._lengths:
                # the whole cycle is read from its start: its plan says its length too
                ids = self.cycle_plan(s, epoch, cycle, topology, rank, segs)
                n = self._lengths[key] = len(ids)
            else:
                n, ids = self._cycle_len(s, epoch, cycle, topology, segs), None
            if n == 0 and not segs:
                self._full_len(s, topology)  # says the source is too small
            if pos + n > lo:
                if node:
                    ids = self._node_cycle(s, epoch, cycle, topology, rank, segs, n)
                elif ids is None:
                    ids = self.cycle_plan(s, epoch, cycle, topology, rank, segs)
                out.append(ids[max(lo - pos, 0) : hi - pos])
            pos, cycle, segs = pos + n, cycle + 1, ()
        if not out:
            return np.zeros((0, topology.rpn) if node else 0, np.int64)
        return np.concatenate(out)

    def _node_cycle(
        self,
        s: int,
        epoch: int,
        cycle: int,
        topology: Topology,
        node: int,
        segments: tuple[Segment, ...],
        n: int,
    ) -> np.ndarray:
        """Source ``s``'s ids that node ``node``'s ranks read of a cycle, ``(n, rpn)``: the
        node's stream dealt round-robin (rank ``j``'s ``i``-th sample is element
        ``i * rpn + j``); without ``drop_last`` (short ranks repeat) rank by rank."""
        rpn = topology.rpn
        if n == 0:
            return np.zeros((0, rpn), np.int64)
        if not self.src_options[s].drop_last:
            ranks = [self.cycle_plan(s, epoch, cycle, topology, node * rpn + j, segments)
                     for j in range(rpn)]  # fmt: skip
            return np.stack(ranks, axis=1)
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        ids = _node_samples(rest, skip, self.src_options[s], topology, node)
        return ids.reshape(n, rpn)

    # -- deals ---------------------------------------------------------------------------

    def _phases(self, progress: MixProgress) -> np.ndarray:
        seed = self.options.seed
        at = progress.epoch_start + progress.start
        keys = [seed & 0xFFFFFFFF, seed >> 32, _SALT_PHASE, progress.epoch, at]
        return np.random.default_rng(keys).random(len(self.tables))

    def deal_key(self, progress: MixProgress) -> tuple[object, ...]:
        """What identifies ``progress``'s deal (not how much of it was consumed)."""
        return self._key(progress)

    def _key(self, progress: MixProgress) -> tuple[object, ...]:
        return (progress.epoch, progress.epoch_start, progress.start, progress.topology,
                progress.cursors, progress.mixture)  # fmt: skip

    def labels(self, progress: MixProgress) -> np.ndarray:
        """The source of each slot of ``progress``'s deal, from its first slot to the end of
        the epoch: the same on every rank."""
        return self._dealt(progress)[0]

    def _dealt(self, progress: MixProgress) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``progress``'s deal as ``deal_order`` gives it, memoised."""
        if progress.mixture != self.digest:
            raise ValueError("this deal ran under another mixture: settle() it first")
        key = self._key(progress)
        if key not in self._deals:
            while len(self._deals) >= 4:  # this epoch's deals and the next's, not all
                del self._deals[next(iter(self._deals))]
            self._deals[key] = self._deal(progress)
        return self._deals[key]

    def _deal(self, progress: MixProgress) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        topo, mix = progress.topology, self.mixture
        clock = float(progress.epoch_start + progress.start)
        phases = self._phases(progress)
        if mix.until is not None:
            x = self.index[mix.until]
            cur = progress.cursor(mix.until)
            left = 0
            if cur.cycle == 0:
                left = self._cycle_len(x, progress.epoch, 0, topo, cur.segments)
            if left == 0:
                return deal_order(self.curve, start=clock, width=topo.world_size,
                                  phases=phases, slots=0)  # fmt: skip
            return deal_order(self.curve, start=clock, width=topo.world_size, phases=phases,
                        until=(x, left))  # fmt: skip
        length = mix.length if mix.length is not None else int(self.totals.sum())
        slots = max(length - progress.start, 0) // topo.world_size
        return deal_order(self.curve, start=clock, width=topo.world_size, phases=phases,
                          slots=slots)  # fmt: skip

    def counts(self, progress: MixProgress, slots: int | None = None) -> np.ndarray:
        """Picks of each source in the first ``slots`` slots of the deal (default: the
        slots consumed)."""
        n = progress.consumed if slots is None else slots
        return np.bincount(self.labels(progress)[:n], minlength=len(self.tables))

    def rank_plan(self, progress: MixProgress, rank: int) -> MixRankPlan:
        """What ``rank`` still reads of this epoch: the rest of the deal, in order."""
        topo = progress.topology
        topo.check_rank(rank)
        labels, order, starts = self._dealt(progress)
        lo = progress.consumed
        if lo > len(labels):
            raise ValueError(
                f"resume state says each rank consumed {lo} samples of this deal but it has "
                f"only {len(labels)}: the state belongs to another mixture"
            )
        before = np.bincount(labels[:lo], minlength=len(self.tables))
        total = np.bincount(labels, minlength=len(self.tables))
        rest = labels[lo:]
        # each source's picks end to end, as the deal numbers them, then one gather by the
        # pick of each slot: no sort, no mask per source
        picks = np.empty(int(starts[-1]), np.int64)
        for s, t in enumerate(self.tables):
            if total[s] == before[s]:
                continue
            cur = progress.cursor(t.name)
            own = self.source_picks(s, cur, progress.epoch, topo, rank, before[s], total[s])
            first = int(starts[s])
            picks[first + int(before[s]) : first + int(total[s])] = own + self.offsets[s]
        ids = picks[order[lo:]]
        return MixRankPlan(ids, rest)

    def node_samples(self, progress: MixProgress, node_rank: int) -> np.ndarray:
        """Virtual ids one node's ranks still read of the deal, position by position (its
        ranks advance in lock-step): the order its cache needs them in."""
        topo = progress.topology
        topo.check_node(node_rank)
        labels, order, starts = self._dealt(progress)
        lo = progress.consumed
        before = np.bincount(labels[:lo], minlength=len(self.tables))
        total = np.bincount(labels, minlength=len(self.tables))
        picks = np.empty((int(starts[-1]), topo.rpn), np.int64)  # as in rank_plan
        for s, t in enumerate(self.tables):
            if total[s] > before[s]:
                cur = progress.cursor(t.name)
                own = self.source_picks(s, cur, progress.epoch, topo, node_rank, before[s],
                                        total[s], node=True)  # fmt: skip
                first = int(starts[s])
                picks[first + int(before[s]) : first + int(total[s])] = own + self.offsets[s]
        out = picks[order[lo:]]
        return out.reshape(-1)

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """Virtual shard numbers (the sources' shard tables end to end) of virtual ids."""
        source = np.searchsorted(self.offsets, ids, side="right") - 1
        out = np.empty(len(ids), np.int64)
        for s in np.unique(source):
            mask = source == s
            own = np.asarray(self.tables[s].sizes, dtype=np.int64)
            ends = np.cumsum(own)
            out[mask] = np.searchsorted(ends, ids[mask] - self.offsets[s], side="right")
            out[mask] += self.shard_offsets[s]
        return out

    def node_shard_order(self, progress: MixProgress, node_rank: int) -> list[int]:
        """The virtual shards one node reads in the rest of the deal, in order of first need:
        what ``cache warm`` fetches and what eviction looks ahead at."""
        shards = self.shard_of(self.node_samples(progress, node_rank))
        uniq, first = np.unique(shards, return_index=True)
        return uniq[np.argsort(first, kind="stable")].tolist()

    # -- moving on -----------------------------------------------------------------------

    def start(self, epoch: int, topology: Topology, epoch_start: int = 0) -> MixProgress:
        """The beginning of ``epoch``, trained after ``epoch_start`` samples in all."""
        cursors = tuple((t.name, Cursor()) for t in self.tables)
        return MixProgress(epoch, epoch_start, 0, topology, cursors, self.digest)

    def fresh(self, epoch: int, topology: Topology) -> MixProgress:
        """The beginning of ``epoch`` for a job that trained every earlier epoch whole under
        ``topology`` (the schedule's clock counts their samples)."""
        at = self.start(0, topology)
        for _ in range(epoch):
            at = self.next_epoch(at)
        return at

    def epoch_samples(self, progress: MixProgress) -> int:
        """Samples (all ranks) of the epoch once ``progress``'s deal runs to its end."""
        return progress.start + len(self.labels(progress)) * progress.topology.world_size

    def next_epoch(self, progress: MixProgress) -> MixProgress:
        done = progress.epoch_start + self.epoch_samples(progress)
        return self.start(progress.epoch + 1, progress.topology, done)

    def settle(
        self, progress: MixProgress, counts: Sequence[int] | np.ndarray, topology: Topology
    ) -> MixProgress:
        """A new deal under this planner's mixture and ``topology`` from where ``progress``
        stands, each source having been read ``counts[name]`` times per rank in its deal
        (``counts`` in ``progress.cursors``'s order). Sources new to the mixture start their
        first cycle; nothing already read in this epoch is read again."""
        old = progress.topology
        cursors = dict(progress.cursors)
        names = [n for n, _ in progress.cursors]
        for name, k in zip(names, counts, strict=True):
            if name not in self.index:
                raise ValueError(f"source {name!r} is not in this mixture {self.mixture.names}")
            s = self.index[name]
            cursors[name] = self.advance(cursors[name], s, progress.epoch, old, int(k))
        ordered = tuple((t.name, cursors.get(t.name, Cursor())) for t in self.tables)
        start = progress.start + progress.consumed * old.world_size
        return MixProgress(progress.epoch, progress.epoch_start, start, topology, ordered,
                           self.digest)  # fmt: skip
