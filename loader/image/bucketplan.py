"""A rank's passes under aspect-ratio buckets: the plan's order for this rank, cut into
one-bucket batches by ``buckets.bucket_order``, from the image sizes of the shard table.

The resume position counts samples delivered in that order: the stretch of the epoch under
the current topology is bucketed as a whole, and a pass continues after the samples already
delivered, so a resume on the same topology is exact. A resume on another topology mid-epoch
(elastic) replays each earlier stretch: every rank of it dealt and bucketed the same way, the
batches its ranks took in lock-step removed, and what is left (undelivered samples, in plan
order, node after node) dealt to the new ranks and bucketed again. Each sample of the epoch
is then delivered once or, with ``drop_last``, dropped and named in the ledger. The replay
costs the whole epoch's sizes once per stretch, what ``drop_last`` already reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from flashfeed.format.manifest import Manifest
from flashfeed.plan.plan import RankPlan, Segment, deal, epoch_sequence, locate

from ..passorder import PassOrder
from ..position import Position
from .buckets import (
    BucketedOrder,
    BucketOptions,
    assign_buckets,
    auto_buckets,
    bucket_order,
    parse_buckets,
)

__all__ = ["BucketPlanner", "bucket_options", "covering_windows"]

_AUTO_SAMPLE = 200_000  # recorded sizes that "auto" looks at, spread over the dataset


def bucket_options(
    buckets: Any, manifest: Manifest, *, image_size: int, max_crop: float
) -> BucketOptions:
    """The ``buckets=``/``max_crop=`` options of a dataset, checked: its shard table must
    record image sizes; ``"auto"`` picks shapes from them."""
    parsed = parse_buckets(buckets)
    table = manifest.table
    if not table.has_image_sizes:
        raise ValueError(
            "buckets= needs the image sizes that the shard table records at ingest or "
            "`flashfeed index` time, and this dataset's manifest has none (written before "
            "sizes were recorded); re-index it with `flashfeed index --overwrite PREFIX` or "
            "re-ingest it"
        )
    if not isinstance(parsed, str):
        return BucketOptions(parsed, max_crop)
    n = int(manifest.num_samples)
    ids = np.arange(0, n, max(1, n // _AUTO_SAMPLE), dtype=np.int64)
    shards, rows = locate(manifest.shard_samples, ids)
    return BucketOptions(
        auto_buckets(table.image_sizes(shards, rows), image_size=image_size), max_crop
    )


def covering_windows(sizes: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """Per sample ``(height, width, window height, window width)``: its bucket and the
    largest window of the bucket's aspect ratio inside its ``(width, height)`` image, as a
    fraction of the image's height and width (what a cover resize then crop keeps)."""
    width, height = sizes[:, 0].astype(np.float64), sizes[:, 1].astype(np.float64)
    scale = np.maximum(hw[:, 1] / width, hw[:, 0] / height)
    rel_h = np.minimum(hw[:, 0] / scale / height, 1.0)
    rel_w = np.minimum(hw[:, 1] / scale / width, 1.0)
    return np.stack([hw[:, 0], hw[:, 1], rel_h, rel_w], axis=1).astype(np.float32)


class BucketPlanner:
    """One rank's bucketed order of the current epoch stretch, computed once per stretch."""

    def __init__(self, options: BucketOptions, manifest: Manifest, batch_size: int) -> None:
        self.options = options
        self.manifest = manifest
        self.batch_size = batch_size
        self._memo: tuple[Any, list[BucketedOrder]] | None = None
        self._left: tuple[Any, np.ndarray] | None = None

    def order(self, position: Position) -> BucketedOrder:
        """The bucketed batches of the whole stretch ``position`` is in (from its start)."""
        p = position
        if p.options.drop_last:  # the fewest full batches of any rank count: every rank's
            return self._orders(p, every=True)[p.ctx.rank]
        return self._orders(p, every=False)[0]

    def _orders(self, p: Position, *, every: bool) -> list[BucketedOrder]:
        """Every rank's bucketed stretch (``every``), or this rank's alone; memoised."""
        key = (p.options, p.epoch, tuple(p.prior), p.topology, None if every else p.ctx.rank)
        if self._memo is None or self._memo[0] != key:
            ranks = range(p.topology.world_size) if every else [p.ctx.rank]
            got = self._bucketed([self._share(p, r).samples for r in ranks], p.options.drop_last)
            self._memo = (key, got)
        return self._memo[1]

    def dropped_total(self, position: Position) -> int:
        """Samples the whole job drops from the current stretch: the plan's surplus and, on
        every rank, short bucket tails (``drop_last``), batches beyond the fewest any rank
        has, and skipped samples; what the ranks' ledgers record as dropped, together."""
        got = self._orders(position, every=True)
        plan = self._share(position, position.ctx.rank).dropped_total
        return int(plan + sum(len(g.dropped) for g in got))

    def surplus(self, position: Position) -> np.ndarray:
        """What the plan's split drops from this rank's stretch (``drop_last``) before any
        bucketing: it goes to the ledger as dropped with the bucket tails."""
        return self._share(position, position.ctx.rank).dropped

    def _share(self, p: Position, rank: int) -> RankPlan:
        """Rank ``rank``'s whole stretch in plan order: the plan's own split when the epoch
        started on this topology, else a deal of what the earlier stretches left."""
        if not p.prior:
            ctx = replace(p.ctx, rank=rank)
            return replace(p, ctx=ctx, consumed=0, _memo=None).rank_plan()
        left = self._left_after(p)
        return deal(left, topology=p.topology, rank=rank, drop_last=p.options.drop_last)

    def _bucketed(self, shares: list[np.ndarray], drop_last: bool) -> list[BucketedOrder]:
        """Every rank's stretch (``shares``, in plan order) cut into one-bucket batches; with
        ``drop_last`` each keeps the fewest full batches of any rank: ranks step together,
        so each delivers that many and drops the rest."""
        got = []
        for whole in shares:
            shards, rows = locate(self.manifest.shard_samples, whole)
            bucket, lost, reason = assign_buckets(
                self.manifest.table.image_sizes(shards, rows), self.options
            )
            got.append(
                bucket_order(
                    whole, bucket, lost, reason, batch_size=self.batch_size, drop_last=drop_last
                )
            )
        if drop_last and len(got) > 1:
            fewest = min(len(g.bounds) - 1 for g in got)
            got = [g.first(fewest) for g in got]
        return got

    def _left_after(self, p: Position) -> np.ndarray:
        """What the stretches of ``p.prior`` left of the epoch, in plan order, node after
        node: each stretch's batches taken in lock-step by every rank removed in turn."""
        key = (p.options, p.epoch, tuple(p.prior))
        if self._left is None or self._left[0] != key:
            first = p.prior[0].topology
            left = epoch_sequence(
                p.shard_sizes, options=p.options, epoch=p.epoch, topology=first
            )  # fmt: skip
            for seg in p.prior:
                left = left[~np.isin(left, self._taken(left, seg, p.options.drop_last))]
            self._left = (key, left)
        return self._left[1]

    def _taken(self, left: np.ndarray, seg: Segment, drop_last: bool) -> np.ndarray:
        """The samples the ranks of ``seg`` delivered out of ``left``: the same number of
        full batches each (a state saved inside the short last batches of the buckets names
        no such number, and is refused)."""
        t, n = seg.topology, seg.samples_per_rank
        shares = [
            deal(left, topology=t, rank=r, drop_last=drop_last).samples for r in range(t.world_size)
        ]
        got = self._bucketed(shares, drop_last)
        k = n // self.batch_size
        full = [int((np.diff(g.bounds) == self.batch_size).sum()) for g in got]
        if n % self.batch_size or k > min(full):
            raise ValueError(
                f"the state says each of {t.world_size} ranks delivered {n} samples, which is "
                f"not a whole number of full batches of {self.batch_size} on every rank of the "
                "bucketed order: it was saved with another batch size or other buckets, or "
                "inside the short last batches of the buckets; resume it on the topology that "
                "saved it"
            )
        return np.concatenate([g.ids[: int(g.bounds[k])] for g in got])

    def pass_order(self, position: Position) -> PassOrder:
        """What a pass reads from ``position`` on: the batches after those delivered."""
        got = self.order(position)
        k = int(np.searchsorted(got.bounds, position.consumed))
        if k >= len(got.bounds) or got.bounds[k] != position.consumed:
            raise ValueError(
                f"the position ({position.consumed} samples consumed) is not at a batch "
                "boundary of the bucketed order: the state was saved with another batch size "
                "or other buckets"
            )
        ids = got.ids[position.consumed :]
        shards, rows = locate(position.shard_sizes, ids)
        hw = np.array(self.options.shapes, np.float64)[got.sample_bucket[position.consumed :]]
        hw = hw.reshape(-1, 2)
        return PassOrder(
            ids, shards, rows, self.batch_size, len(got.bounds) - 1 - k,
            bounds=got.bounds[k:] - position.consumed,
            shapes=covering_windows(self.manifest.table.image_sizes(shards, rows), hw),
        )  # fmt: skip

    def report(self, position: Position) -> dict[str, Any]:
        """Per bucket of this rank's epoch stretch: shape, samples, batches and the mean
        fraction of image area its crops lose; the samples skipped, by reason; the samples
        dropped (``drop_last``: short tails, and full batches beyond the fewest any rank has)."""
        got = self.order(position)
        out = []
        for b, (h, w) in enumerate(self.options.shapes):
            mine = got.sample_bucket == b
            n = int(mine.sum())
            out.append(
                {
                    "shape": [h, w],
                    "samples": n,
                    "batches": int((got.batch_bucket == b).sum()),
                    "crop_lost": float(got.crop_lost[mine].mean()) if n else 0.0,
                }
            )
        skipped = sum(got.skipped.values())
        return {
            "epoch": position.epoch,
            "buckets": out,
            "skipped": dict(got.skipped),
            "dropped": int(len(got.dropped) - skipped),
        }
