"""A rank's passes under aspect-ratio buckets: the plan's order for this rank, cut into
one-bucket batches by ``buckets.bucket_order``, from the image sizes of the shard table.

The resume position counts samples delivered in that order: the stretch of the epoch under
the current topology is bucketed as a whole, and a pass continues after the samples already
delivered, so a resume on the same topology is exact. A new world size mid-epoch would need
every earlier rank's bucketed order to know what remains, so it is refused with one clear
error; at an epoch boundary any world size resumes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from flashfeed.manifest import Manifest
from flashfeed.plan import locate

from .buckets import (
    BucketedOrder,
    BucketOptions,
    assign_buckets,
    auto_buckets,
    bucket_order,
    parse_buckets,
)
from .passorder import PassOrder
from .position import Position

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
        self._memo: tuple[Any, BucketedOrder] | None = None

    def order(self, position: Position) -> BucketedOrder:
        """The bucketed batches of the whole stretch ``position`` is in (from its start)."""
        p = position
        key = (p.options, p.epoch, tuple(p.prior), p.topology, p.ctx.rank)
        if self._memo is None or self._memo[0] != key:
            whole, (bucket, lost, reason) = self._assigned(p, p.ctx.rank)
            got = bucket_order(
                whole, bucket, lost, reason,
                batch_size=self.batch_size, drop_last=p.options.drop_last,
            )  # fmt: skip
            if p.options.drop_last and p.topology.world_size > 1:
                got = got.first(self._common_batches(p))
            self._memo = (key, got)
        return self._memo[1]

    def _assigned(
        self, p: Position, rank: int
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Rank ``rank``'s whole stretch in plan order, and its buckets (``assign_buckets``)."""
        ctx = replace(p.ctx, rank=rank)
        whole = replace(p, ctx=ctx, consumed=0, _memo=None).remaining()
        shards, rows = locate(p.shard_sizes, whole)
        return whole, assign_buckets(self.manifest.table.image_sizes(shards, rows), self.options)

    def _common_batches(self, p: Position) -> int:
        """The full batches every rank has (the fewest of any rank): ranks step together, so
        each delivers that many and drops the rest. Reads every rank's plan: the cost of
        the whole epoch's sizes, once per stretch."""
        fewest = None
        for rank in range(p.topology.world_size):
            _, (bucket, _, _) = self._assigned(p, rank)
            counts = np.bincount(bucket[bucket >= 0], minlength=len(self.options.shapes))
            full = int((counts // self.batch_size).sum())
            fewest = full if fewest is None else min(fewest, full)
        return int(fewest or 0)

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
