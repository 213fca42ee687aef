"""The read plan of a mixture: which sample of which source each rank reads, in order.

Pure and rank-local, like ``flashfeed.plan.plan``, on which it is built:

- Each source keeps its own plan (``rank_plan`` over its shard sizes, with a seed derived
  from the run's seed and the source's digest): its own shard order, windows and node
  affinity. A source read more often than its plan is long is read again in a fresh
  permutation (a new *cycle*, planned as source epoch ``epoch * 2**32 + cycle``); one read
  less is read as a prefix of its order: sampled without replacement. A cycle is split
  among the ranks without repeats (whatever ``drop_last``): the fewer than a world size of
  samples the split leaves are a completed cycle's *losses*, counted and named per rank.
- ``flashfeed.plan.mixdeal`` deals a rank's slots to sources by weight. The deal does not depend
  on the rank: all ranks read the same number of samples of each source, in lock-step.
- So a source's place in an epoch is a ``Cursor``: its cycle and the ``Segment`` values
  of that cycle already trained, today's elastic-resume state per source. A deal runs under
  one topology and one mixture; a new world size or new weights start a new deal from the
  cursors where the last one stopped, so each source's rest is re-split exactly once.

Positions are global sample counts: the schedule's clock is the samples trained since the
start of epoch 0 (every rank together); an epoch of ``length`` samples deals
``length // world_size`` slots per rank, cut to whole batches (``batch``) so that every
slot dealt is delivered. Samples are named by virtual ids: the sources' ids
laid end to end in the mixture's order (``MixPlanner.offsets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from flashfeed.plan.mixcycles import Cursor, SourceCycles, SourceTable
from flashfeed.plan.mixdeal import WeightCurve, deal_order, whole_batches
from flashfeed.plan.mixture import Mixture
from flashfeed.plan.plan import (
    PlanOptions,
    Topology,
)

__all__ = ["Cursor", "MixPlanner", "MixProgress", "MixRankPlan", "SourceTable"]

_SALT_PHASE = 0x70686173


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
    dropped: int = 0  # samples the epoch's completed cycles left unread before this deal

    def cursor(self, name: str) -> Cursor:
        return dict(self.cursors).get(name, Cursor())


@dataclass(frozen=True)
class MixRankPlan:
    """What one rank still reads of a deal: virtual sample ids and the source of each."""

    samples: np.ndarray
    sources: np.ndarray
    #: what the rank's share of completed cycles leaves unread (virtual ids), and for each
    #: the slots of the deal consumed once its cycle is complete
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class MixPlanner:
    """The plan of one mixture over its sources' shard tables (no I/O).

    ``tables`` are in the mixture's source order. ``batch``: slots a deal's length is a
    multiple of (the loader's batch when it drops a last partial batch), so that an epoch
    deals what it delivers. Deals are memoised: a rank asking again for the same deal (after
    consuming some of it) costs an array slice.
    """

    def __init__(
        self,
        mixture: Mixture,
        tables: Sequence[SourceTable],
        options: PlanOptions,
        *,
        batch: int = 1,
    ):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        self.batch = batch
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
        self.cycles = SourceCycles(tables, options)
        self.offsets = np.concatenate([[0], np.cumsum(totals)])
        counts = np.array([len(t.sizes) for t in tables], dtype=np.int64)
        self.shard_offsets = np.concatenate([[0], np.cumsum(counts)])
        self.index = {t.name: i for i, t in enumerate(tables)}
        # a deal: its labels, and the pick of each slot (``deal_order``)
        self._deals: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

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

    def _until_left(self, progress: MixProgress) -> int:
        """Picks per rank the ``until`` source has left of its one cycle in this deal."""
        cur = progress.cursor(str(self.mixture.until))
        if cur.cycle != 0:
            return 0
        x = self.index[str(self.mixture.until)]
        return self.cycles.cycle_len(x, progress.epoch, 0, progress.topology, cur.segments)

    def epoch_length(self) -> int:
        """Global samples of an epoch of ``length`` (or, by default, of all sources)."""
        mix = self.mixture
        return mix.length if mix.length is not None else int(self.totals.sum())

    def _deal(self, progress: MixProgress) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        topo, mix = progress.topology, self.mixture
        clock = float(progress.epoch_start + progress.start)
        phases = self._phases(progress)
        width = topo.world_size
        if mix.until is not None:
            left = self._until_left(progress)
            if left == 0:
                return deal_order(self.curve, start=clock, width=width, phases=phases, slots=0)
            x = self.index[mix.until]
            dealt = deal_order(self.curve, start=clock, width=width, phases=phases,
                               until=(x, left))  # fmt: skip
            return whole_batches(dealt, self.curve, start=clock, width=width, phases=phases,
                                 until=(x, left), batch=self.batch)  # fmt: skip
        slots = max(self.epoch_length() - progress.start, 0) // width
        slots -= slots % self.batch  # whole batches: what is dealt is delivered
        return deal_order(self.curve, start=clock, width=width, phases=phases, slots=slots)

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
        gone_ids: list[np.ndarray] = []
        gone_at: list[np.ndarray] = []
        for s, t in enumerate(self.tables):
            cur = progress.cursor(t.name)
            if total[s] == before[s]:
                if (
                    self.mixture.until == t.name
                    and cur.cycle == 0
                    and (self._until_left(progress) == 0)
                ):  # its one cycle has nothing left for these ranks: the epoch ends on it
                    plan = self.cycles.cycle_rank(s, progress.epoch, 0, topo, rank, cur.segments)
                    gone_ids.append(plan.dropped + self.offsets[s])
                    gone_at.append(np.full(len(plan.dropped), max(len(labels), 1), np.int64))
                continue
            found: list[tuple[int, np.ndarray]] = []
            own = self.cycles.source_picks(s, cur, progress.epoch, topo, rank, before[s], total[s],
                                    dropped=found)  # fmt: skip
            first = int(starts[s])
            picks[first + int(before[s]) : first + int(total[s])] = own + self.offsets[s]
            if found:  # cycles completed: the rank's share of what each left, at its slot
                slots = np.flatnonzero(labels == s)
                for pick, gone in found:
                    gone_ids.append(gone + self.offsets[s])
                    gone_at.append(np.full(len(gone), slots[pick] + 1, np.int64))
        ids = picks[order[lo:]]
        if not gone_ids:
            return MixRankPlan(ids, rest)
        dropped = np.concatenate(gone_ids).astype(np.int64)
        return MixRankPlan(ids, rest, dropped, np.concatenate(gone_at))

    def losses(self, progress: MixProgress) -> int:
        """Samples the epoch's completed cycles leave unread (all ranks together): those
        before this deal and those of this deal to the end of the epoch."""
        topo = progress.topology
        total = np.bincount(self.labels(progress), minlength=len(self.tables))
        out = progress.dropped
        for s, t in enumerate(self.tables):
            cur = progress.cursor(t.name)
            out += self.cycles.source_losses(s, cur, progress.epoch, topo, int(total[s]))
        if self.mixture.until is not None and self._until_left(progress) == 0:
            cur = progress.cursor(self.mixture.until)
            if cur.cycle == 0:
                x = self.index[self.mixture.until]
                out += self.cycles.cycle_loss(x, progress.epoch, 0, topo, cur.segments)
        return int(out)

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
                own = self.cycles.source_picks(s, cur, progress.epoch, topo, node_rank, before[s],
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

    def next_epoch(self, progress: MixProgress, delivered: int | None = None) -> MixProgress:
        """The next epoch's start; the clock moves by the samples delivered: ``delivered``
        slots per rank of this deal (default: all of it)."""
        if delivered is None:
            done = self.epoch_samples(progress)
        else:
            done = progress.start + delivered * progress.topology.world_size
        return self.start(progress.epoch + 1, progress.topology, progress.epoch_start + done)

    def check_epoch(self, topology: Topology) -> None:
        """Refuse an epoch that deals no slot to ``topology``'s ranks (a length below one
        batch per rank, an ``until`` source with fewer samples than ranks): never a silent
        empty pass."""
        if self.mixture.until is not None:
            self.cycles.full_len(self.index[self.mixture.until], topology)
            return
        length, width = self.epoch_length(), topology.world_size
        if length // width < self.batch:
            what = f"length={length}" if self.mixture.length is not None else (
                f"the sources' {length} samples (the default length)"
            )  # fmt: skip
            got = f"{length // width} samples, fewer than one batch of {self.batch}"
            raise ValueError(
                f"mixture {what} gives each of {width} ranks "
                f"{got if self.batch > 1 else 'no sample'}: an epoch would deliver nothing; "
                f"give a length of at least {self.batch * width}"
            )

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
        dropped = progress.dropped
        for name, k in zip(names, counts, strict=True):
            if name not in self.index:
                raise ValueError(f"source {name!r} is not in this mixture {self.mixture.names}")
            s = self.index[name]
            dropped += self.cycles.source_losses(s, cursors[name], progress.epoch, old, int(k))
            cursors[name] = self.cycles.advance(cursors[name], s, progress.epoch, old, int(k))
        ordered = tuple((t.name, cursors.get(t.name, Cursor())) for t in self.tables)
        start = progress.start + progress.consumed * old.world_size
        return MixProgress(progress.epoch, progress.epoch_start, start, topology, ordered,
                           self.digest, dropped=dropped)  # fmt: skip
