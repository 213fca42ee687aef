"""Each source's cycles in a mixture: its own plan, read again in a fresh permutation once
read to its end, split among the ranks without repeats (``flashfeed.plan.mixplan`` deals
the sources' picks to slots).

A source's place is a ``Cursor``: its cycle and the ``Segment`` values of that cycle already
trained. Cycle ``c`` of epoch ``e`` is planned as source epoch ``e * CYCLE + c`` with a seed
derived from the run's seed and the source's digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from flashfeed.plan.plan import (
    PlanOptions,
    RankPlan,
    Segment,
    Topology,
    _epoch,
    _node_samples,
    _rank_plan,
    _sizes,
)
from flashfeed.plan.streams import _Chain, _Epoch

__all__ = ["CYCLE", "Cursor", "SourceCycles", "SourceTable"]

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


def _derived_seed(seed: int, digest: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{digest}".encode()).digest()[:8], "big") >> 1


def _merge(segments: tuple[Segment, ...], topology: Topology, k: int) -> tuple[Segment, ...]:
    """``segments`` after each rank took ``k`` more samples under ``topology``."""
    if segments and segments[-1].topology == topology:
        last = segments[-1]
        return (*segments[:-1], replace(last, samples_per_rank=last.samples_per_rank + k))
    return (*segments, Segment(topology.world_size, topology.rpn, k))


class SourceCycles:
    """The cycles of a mixture's sources (``tables``, in the mixture's order) under the run's
    ``options``: plans, lengths and losses, memoised per (source, epoch, cycle, topology)."""

    def __init__(self, tables: Sequence[SourceTable], options: PlanOptions):
        self.tables = tuple(tables)
        self.totals = np.array([int(np.asarray(t.sizes).sum()) for t in tables], dtype=np.int64)
        # a cycle never repeats a sample: its split leaves the rest out (``cycle_loss``)
        self.src_options = tuple(
            replace(options, seed=_derived_seed(options.seed, t.digest), drop_last=True)
            for t in tables
        )
        self._lengths: dict[tuple[object, ...], int] = {}
        self._losses: dict[tuple[object, ...], int] = {}
        self._chains: dict[int, _Chain] = {}

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
        return self.cycle_rank(s, epoch, cycle, topology, rank, segments).samples

    def cycle_rank(
        self,
        s: int,
        epoch: int,
        cycle: int,
        topology: Topology,
        rank: int,
        segments: tuple[Segment, ...] = (),
    ) -> RankPlan:
        """``rank``'s plan of a cycle: what it still reads, and its share of what the cycle's
        split leaves unread (a rest smaller than the world size: all of it)."""
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        try:
            return _rank_plan(rest, skip, self.src_options[s], topology, rank)
        except ValueError as exc:
            raise ValueError(f"source {self.tables[s].name!r}: {exc}") from None

    def cycle_len(
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
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        return max(rest.current.per_rank(True) - skip, 0)

    def cycle_loss(
        self, s: int, epoch: int, cycle: int, topology: Topology, segments: tuple[Segment, ...]
    ) -> int:
        """Samples of a cycle that its split among ``topology``'s ranks leaves unread (all
        ranks together): fewer than a world size, or the whole rest when it is smaller."""
        key = (s, epoch, cycle, topology, segments)
        if key not in self._losses:
            rest, _ = self._epoch(s, epoch, cycle, topology, segments)
            level = rest.current
            self._losses[key] = int(level.length - level.per_rank(True) * topology.world_size)
        return self._losses[key]

    def source_losses(self, s: int, cursor: Cursor, epoch: int, topology: Topology, k: int) -> int:
        """What the cycles that ``k`` more picks per rank complete leave unread (as
        ``advance`` moves: a cycle is complete once read to its end, one with nothing left
        for these ranks at the next pick)."""
        out, pos, cycle, segs = 0, 0, cursor.cycle, cursor.segments
        while True:
            n = self.cycle_len(s, epoch, cycle, topology, segs)
            if n == 0 and not segs:
                self.full_len(s, topology)  # says the source is too small
            if k - pos < max(n, 1):
                return out
            out += self.cycle_loss(s, epoch, cycle, topology, segs)
            pos, cycle, segs = pos + n, cycle + 1, ()

    def full_len(self, s: int, topology: Topology) -> int:
        """Samples per rank of a whole cycle of source ``s`` (the same in every cycle)."""
        n = self.cycle_len(s, 0, 0, topology)
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
        rest = self.cycle_len(s, epoch, cursor.cycle, topology, cursor.segments)
        if k < rest:
            return Cursor(cursor.cycle, _merge(cursor.segments, topology, k))
        full, part = divmod(k - rest, self.full_len(s, topology))
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
        dropped: list[tuple[int, np.ndarray]] | None = None,
    ) -> np.ndarray:
        """Source ``s``'s own ids of ``rank``'s picks ``[lo, hi)`` of a deal from ``cursor``;
        with ``node``, of every rank of node ``rank``: one row per pick, one column per rank.
        ``dropped`` gets, for each cycle a pick in ``[lo, hi)`` completes (``source_losses``),
        that pick and the rank's share of what the cycle leaves unread."""
        out, pos, cycle, segs = [], 0, cursor.cycle, cursor.segments
        while pos < hi:
            key = (s, epoch, cycle, topology, segs)
            plan = None
            if not node and pos >= lo and key not in self._lengths:
                # the whole cycle is read from its start: its plan says its length too
                plan = self.cycle_rank(s, epoch, cycle, topology, rank, segs)
                n = self._lengths[key] = len(plan.samples)
            else:
                n = self.cycle_len(s, epoch, cycle, topology, segs)
            if n == 0 and not segs:
                self.full_len(s, topology)  # says the source is too small
            if pos + n > lo:
                if node:
                    ids = self.node_cycle(s, epoch, cycle, topology, rank, segs, n)
                else:
                    plan = plan or self.cycle_rank(s, epoch, cycle, topology, rank, segs)
                    ids = plan.samples
                out.append(ids[max(lo - pos, 0) : hi - pos])
            done = pos + max(n, 1) - 1  # the pick that completes the cycle
            if dropped is not None and lo <= done < hi:
                plan = plan or self.cycle_rank(s, epoch, cycle, topology, rank, segs)
                dropped.append((done, plan.dropped))
            pos, cycle, segs = pos + n, cycle + 1, ()
        if not out:
            return np.zeros((0, topology.rpn) if node else 0, np.int64)
        return np.concatenate(out)

    def node_cycle(
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
        ``i * rpn + j``)."""
        rpn = topology.rpn
        if n == 0:
            return np.zeros((0, rpn), np.int64)
        rest, skip = self._epoch(s, epoch, cycle, topology, segments)
        ids = _node_samples(rest, skip, self.src_options[s], topology, node)
        return ids.reshape(n, rpn)
