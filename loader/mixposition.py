"""Where a rank stands in a mixture's plan, and the state that saves and restores it.

The state is the deal the job is in (``flashfeed.plan.mixplan.MixProgress``: where it started,
under which topology and mixture, each source's cursor there) plus the slots consumed and
what they read of each source: a few integers per source. Loaded under the same mixture and
world size, the very same sequence continues. Under another world size, or other weights (a
schedule or a length changed, a source added), a new deal starts from where every source
stands: nothing read in this epoch is read again, and the change is recorded in the state.
A state whose sources are missing or hold other data is refused, naming the source.

What the epoch's completed cycles leave unread is counted (``RankPlan.dropped_total``, the
state's ``deal.dropped`` for the deals before this one) and each rank's share of it is named
once its cycle is complete (``dropped_between``), for the ledger.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from flashfeed.plan.mixplan import Cursor, MixPlanner, MixProgress, MixRankPlan
from flashfeed.plan.plan import PlanOptions, RankPlan, Topology

from .datasetinfo import dataset_id, shard_samples
from .distributed import DistContext
from .mixsource import MixtureDataset
from .position import (
    STATE_VERSION,
    PlanPosition,
    Position,
    _field,
    _segments,
    check_state,
    options_fields,
    read_options,
)

__all__ = ["COUNT_AHEAD", "MixPosition", "plan_position"]

#: batches whose samples per source ``MixPosition.source_counts`` counts at once
COUNT_AHEAD = 64


def plan_position(
    dataset: Any, ctx: DistContext, options: PlanOptions, *, batch: int = 1, per_sample: int = 1
) -> PlanPosition:
    """A loader's place in the plan of ``dataset``: a mixture's (``MixPosition``, its deals
    cut to ``batch``) or one dataset's (``Position``, ``per_sample`` plan entries per stored
    sample). The one place a loader's kind of dataset picks its position."""
    if isinstance(dataset, MixtureDataset):
        if per_sample != 1:
            raise ValueError("several plan entries per sample need one dataset, not a mixture")
        return MixPosition(dataset, ctx, options, batch=batch)
    sizes = shard_samples(dataset) * per_sample
    return Position(sizes, ctx, options, dataset_id=dataset_id(dataset))


class MixPosition:
    """A rank's position in a mixture's plan; the interface of ``Position``."""

    _deal: MixProgress  # the deal, with the samples taken when it was last set
    _taken: int  # samples each rank took of the deal: advancing moves only this
    _sources: np.ndarray | None  # the source of each sample of this rank's share of the deal
    _counted: dict[tuple[int, int], tuple[tuple[str, int], ...]]  # ``source_counts`` ahead

    def __init__(
        self, dataset: MixtureDataset, ctx: DistContext, options: PlanOptions, *, batch: int = 1
    ) -> None:
        """``batch``: the loader's batch when it drops a last partial batch (else 1): a
        deal is cut to whole batches, so the epoch deals what it delivers."""
        self.mix = dataset
        self.ctx = ctx
        self.batch = batch
        self.shard_sizes = dataset.manifest.shard_samples
        self.dataset_id: str | None = dataset.manifest.digest
        self._plan(options)
        self.planner.check_epoch(ctx.topology)
        self.progress = self.planner.start(0, ctx.topology)  # its deal; see ``consumed``
        self.changes: list[list[Any]] = []
        self._memo: tuple[Any, MixRankPlan] | None = None

    def _plan(self, options: PlanOptions) -> None:
        self.options = options
        self.planner = MixPlanner(self.mix.mixture, self.mix.tables(), options, batch=self.batch)

    @property
    def topology(self) -> Topology:
        return self.ctx.topology

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    @property
    def progress(self) -> MixProgress:
        """Where the job stands: the deal and the samples each rank took of it."""
        if self._deal.consumed != self._taken:
            self._deal = replace(self._deal, consumed=self._taken)
        return self._deal

    @progress.setter
    def progress(self, value: MixProgress) -> None:
        self._deal, self._taken = value, value.consumed
        self._sources = None  # another deal: ``source_counts`` remakes it
        self._counted = {}

    @property
    def consumed(self) -> int:
        """Samples this rank took in the current deal."""
        return self._taken

    @property
    def num_samples(self) -> int:
        return int(self.shard_sizes.sum())

    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self.progress = self.planner.fresh(int(epoch), self.topology)

    def next_epoch(self) -> None:
        """The next epoch, once this one's pass ended: the clock moves by what it delivered."""
        self.progress = self.planner.next_epoch(self.progress, self._taken)

    def following(self) -> MixPosition:
        """A copy standing at the start of the next epoch."""
        ahead = MixPosition.__new__(MixPosition)
        ahead.__dict__.update(self.__dict__)
        ahead._memo = None
        ahead.progress = self.planner.next_epoch(self.progress, self._taken)
        return ahead

    def rank_plan(self) -> RankPlan:
        """What this rank still reads of this epoch (virtual sample ids), its share of what
        the cycles still to complete leave unread, and the epoch's losses in all."""
        share = self._share_plan()
        samples = share.samples
        if self._taken > len(samples):
            raise ValueError(
                f"resume state says each rank consumed {self._taken} samples of this deal but "
                f"it has only {len(samples)}: the state belongs to another mixture"
            )
        later = share.dropped[share.dropped_at > self._taken]
        empty = np.zeros(0, np.int64)
        return RankPlan(samples[self._taken :], later, empty, self.planner.losses(self._deal))

    def dropped_between(self, lo: int, hi: int) -> np.ndarray:
        """This rank's share of what the cycles complete once ``hi`` (not yet at ``lo``)
        samples of the deal were taken leave unread: virtual ids, for the ledger."""
        share = self._share_plan()
        return share.dropped[(share.dropped_at > lo) & (share.dropped_at <= hi)]

    def _share(self) -> np.ndarray:
        """This rank's whole share of the current deal, planned once per deal."""
        return self._share_plan().samples

    def _share_plan(self) -> MixRankPlan:
        """``_share`` with the source of each sample."""
        key = (self.planner.deal_key(self._deal), self.ctx.rank)
        if self._memo is None or self._memo[0] != key:
            whole = replace(self._deal, consumed=0)
            self._memo = (key, self.planner.rank_plan(whole, self.ctx.rank))
        return self._memo[1]

    def remaining(self) -> np.ndarray:
        samples = self._share()
        if self._taken > len(samples):
            self.rank_plan()  # says why
        return samples[self._taken :]

    def advance(self, n: int) -> None:
        self._taken += n

    def source_counts(self, samples: int) -> tuple[tuple[str, int], ...]:
        """Samples per source among the next ``samples`` of the plan (what a batch that the
        loader checked against its pass order holds), for the statistics. Counted for the
        next ``COUNT_AHEAD`` batches of that size at once (one ``np.bincount``), not per batch."""
        if samples <= 0:
            return ()
        key = (self._taken, samples)
        got = self._counted.get(key)
        if got is None:
            self._count_ahead(samples)
            got = self._counted[key]
        return got

    def _count_ahead(self, samples: int) -> None:
        if self._sources is None:  # once per deal (the progress setter drops it), not per batch
            self.rank_plan()  # checks the samples taken against the share
            self._sources = self._share_plan().sources  # the source of each sample
        names, width = self.mix.names, len(self.mix.names)
        at = self._sources[self._taken : self._taken + COUNT_AHEAD * samples]
        rows = max(-(-len(at) // samples), 1)  # the last may be short: the share's end
        cell = np.repeat(np.arange(rows, dtype=np.int64) * width, samples)[: len(at)] + at
        counts = np.bincount(cell, minlength=rows * width).reshape(rows, width).tolist()
        # a batch holding every source (the common case) takes its pairs as zip makes them
        self._counted = {
            (self._taken + i * samples, samples): tuple(zip(names, row, strict=True))
            if all(row)
            else tuple((n, c) for n, c in zip(names, row, strict=True) if c)
            for i, row in enumerate(counts)
        }

    def state_dict(self) -> dict[str, Any]:
        p, t = self.progress, self.topology
        counts = self.planner.counts(p)
        mix = self.mix.mixture
        return {
            "version": STATE_VERSION,
            "kind": "mixture",
            "dataset": self.dataset_id,
            "mixture": mix.digest,
            "sources": [
                [n, d.manifest.digest]
                for n, d in zip(self.mix.names, self.mix.datasets, strict=True)
            ],
            **options_fields(self.options),
            "epoch": p.epoch,
            "world_size": t.world_size,
            "ranks_per_node": t.rpn,
            "samples_consumed": p.start + p.consumed * p.topology.world_size,
            "epoch_start": p.epoch_start,
            "deal": {
                "start": p.start,
                "world_size": p.topology.world_size,
                "ranks_per_node": p.topology.rpn,
                "mixture": p.mixture,
                "consumed": p.consumed,
                "dropped": p.dropped,
                "counts": [int(c) for c in counts],
                "cursors": [
                    [
                        name,
                        c.cycle,
                        [[s.world_size, s.ranks_per_node, s.samples_per_rank] for s in c.segments],
                    ]
                    for name, c in p.cursors
                ],
            },
            "changes": list(self.changes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> PlanOptions:
        """Restore a position saved by any rank of any world size, under this mixture or one
        that differs only in weights, schedule, length or added sources."""
        check_state(state)
        if state.get("kind") != "mixture":
            raise ValueError(
                f"the state belongs to one dataset ({state.get('dataset')}), this loader reads "
                f"the mixture {list(self.mix.names)}"
            )
        self._check_sources(state.get("sources"))
        options = read_options(state)
        if options != self.options:
            self._plan(options)
        progress, counts = _progress(state)
        self._check_length(progress, state)
        same_sources = [n for n, _ in progress.cursors] == list(self.mix.names)
        if (
            progress.mixture == self.mix.mixture.digest
            and progress.topology == self.topology
            and same_sources
        ):
            if progress.consumed > len(self.planner.labels(progress)) or not np.array_equal(
                self.planner.counts(progress), counts
            ):
                raise ValueError(
                    "the state does not fit this mixture's plan (its counts per source differ): "
                    "it belongs to another mixture"
                )
        else:
            progress = self.planner.settle(progress, counts, self.topology)
        self.progress = progress
        self.changes = list(state.get("changes") or [])
        if progress.mixture != state["deal"]["mixture"]:
            self.changes.append([progress.epoch, progress.start, progress.mixture])
        self._memo = None
        self.rank_plan()
        return self.options

    def _check_length(self, progress: MixProgress, state: dict[str, Any]) -> None:
        """A length below what the state's epoch consumed would leave nothing to read: refused
        by value (an epoch the state finished goes on to the next one)."""
        length = self.mix.mixture.length
        done = progress.start + progress.consumed * progress.topology.world_size
        if length is not None and length < done and not state.get("finished"):
            raise ValueError(
                f"mixture length={length} is below the {done} samples epoch "
                f"{progress.epoch} already consumed: give a length above {done}, or resume "
                "at the next epoch"
            )

    def _check_sources(self, raw: Any) -> None:
        if not isinstance(raw, list):
            raise ValueError(f"state field 'sources' must be a list, got {raw!r}")
        mine = {n: d.manifest.digest for n, d in zip(self.mix.names, self.mix.datasets,
                                                     strict=True)}  # fmt: skip
        for item in raw:
            name, digest = item
            if name not in mine:
                raise ValueError(
                    f"the state was saved with source {name!r}, which this mixture "
                    f"{list(self.mix.names)} lacks: a source may be added at resume, not removed"
                )
            if mine[name] != digest:
                raise ValueError(
                    f"source {name!r} holds other data than when the state was saved "
                    f"(dataset {digest}, now {mine[name]})"
                )


def _progress(state: dict[str, Any]) -> tuple[MixProgress, np.ndarray]:
    deal = state.get("deal")
    if not isinstance(deal, dict):
        raise ValueError(f"state field 'deal' must be a mapping, got {deal!r}")
    try:
        cursors = tuple(
            (str(name), Cursor(int(cycle), tuple(_segments(segs))))
            for name, cycle, segs in deal["cursors"]
        )
        topo = Topology(int(deal["world_size"]), int(deal["ranks_per_node"]))
        progress = MixProgress(
            epoch=_field(state, "epoch", int),
            epoch_start=_field(state, "epoch_start", int),
            start=int(deal["start"]),
            topology=topo,
            cursors=cursors,
            mixture=str(deal["mixture"]),
            consumed=int(deal["consumed"]),
            dropped=int(deal.get("dropped", 0)),  # absent in states saved before it counted
        )
        counts = np.asarray([int(c) for c in deal["counts"]], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"state field 'deal' is malformed: {exc}") from None
    if len(counts) != len(cursors) or (counts < 0).any():
        raise ValueError(f"state field 'deal' has bad counts {counts.tolist()}")
    return progress, counts
