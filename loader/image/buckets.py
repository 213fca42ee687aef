"""Aspect-ratio buckets: each image goes to the bucket shape nearest its own aspect ratio;
the largest window of the bucket's shape inside it (what a resize to cover the bucket and a
crop keep) is decoded and resized to the bucket; every batch holds one bucket.

Pure and seeded like the plan: which bucket a sample takes follows from the image sizes the
shard table records (at ingest or ``flashfeed index`` time), and the batches of a pass are a
fixed function of the rank's plan order: walking it, a bucket's batch is complete (and takes
its place in the order) when its ``batch_size``-th sample is reached. What is left in each
bucket at the end is one short batch per bucket after the full ones (``drop_last=False``) or
dropped (``drop_last=True``), named in the ledger; with ``drop_last`` every rank of a job
delivers the same number of batches (the fewest full ones of any rank), so that ranks that
step together stay together. A sample whose crop would lose more than
``max_crop`` of its area (an extreme aspect ratio such as 100:1), or without a recorded size,
is skipped before the plan is cut into batches and counted with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = [
    "AUTO_RATIOS",
    "BucketOptions",
    "BucketedOrder",
    "assign_buckets",
    "auto_buckets",
    "bucket_order",
    "parse_buckets",
]

#: the aspect ratios (width / height) ``buckets="auto"`` chooses from
AUTO_RATIOS = (1 / 4, 1 / 3, 1 / 2, 2 / 3, 3 / 4, 1.0, 4 / 3, 3 / 2, 2.0, 3.0, 4.0)
#: the reasons a sample is skipped
NO_SIZE = "no recorded image size"
TOO_MUCH_CROP = "crop to the nearest bucket would lose more than max_crop"


@dataclass(frozen=True)
class BucketOptions:
    """``shapes``: the buckets as (height, width); ``max_crop``: the largest fraction of an
    image's area a crop to its bucket may lose before the sample is skipped."""

    shapes: tuple[tuple[int, int], ...]
    max_crop: float = 0.5

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("buckets must name at least one (height, width) shape")
        if not 0 <= self.max_crop < 1:
            raise ValueError(f"max_crop must be in [0, 1), got {self.max_crop!r}")


def parse_buckets(buckets: Any) -> tuple[tuple[int, int], ...] | str:
    """The ``buckets=`` option: a list of (height, width) pairs of positive integers, or
    ``"auto"``."""
    if buckets == "auto":
        return "auto"
    if isinstance(buckets, str) or not isinstance(buckets, Sequence) or not buckets:
        raise ValueError(
            f"buckets must be 'auto' or a non-empty list of (height, width), got {buckets!r}"
        )
    out = []
    for b in buckets:
        ok = isinstance(b, Sequence) and len(b) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in b)
        if not ok:
            raise ValueError(f"a bucket must be (height, width) of integers > 0, got {b!r}")
        out.append((int(b[0]), int(b[1])))
    if len(set(out)) != len(out):
        raise ValueError(f"buckets repeat a shape: {out}")
    return tuple(out)


def auto_buckets(
    sizes: np.ndarray, *, image_size: int, min_share: float = 0.01, multiple: int = 8
) -> tuple[tuple[int, int], ...]:
    """Buckets of about ``image_size``² pixels (sides rounded to ``multiple``) for the
    ``AUTO_RATIOS`` that are nearest to at least ``min_share`` of the recorded ``(width,
    height)`` sizes; the square one when nothing is recorded."""
    shapes = []
    for r in AUTO_RATIOS:
        h = max(multiple, round(image_size / np.sqrt(r) / multiple) * multiple)
        w = max(multiple, round(image_size * np.sqrt(r) / multiple) * multiple)
        if (int(h), int(w)) not in shapes:  # ratios that round to one shape
            shapes.append((int(h), int(w)))
    known = sizes[(sizes[:, 0] > 0) & (sizes[:, 1] > 0)] if len(sizes) else sizes
    if not len(known):
        return ((image_size, image_size),)
    nearest = _nearest(known, shapes)
    counts = np.bincount(nearest, minlength=len(shapes))
    keep = [s for s, c in zip(shapes, counts, strict=True) if c >= min_share * len(known)]
    return tuple(keep) or (shapes[int(np.argmax(counts))],)


def _nearest(sizes: np.ndarray, shapes: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per ``(width, height)``: the shape whose aspect ratio is nearest (in log ratio)."""
    ar = np.log(sizes[:, 0].astype(np.float64) / sizes[:, 1])
    bucket_ar = np.log(np.array([w / h for h, w in shapes], np.float64))
    return np.abs(ar[:, None] - bucket_ar[None, :]).argmin(axis=1)


def assign_buckets(
    sizes: np.ndarray, options: BucketOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(bucket, crop_lost, reason)`` per ``(width, height)``: the nearest bucket (-1 when
    skipped), the fraction of the image's area its crop loses after a resize that covers the
    bucket, and the skip reason's code (0 kept, 1 ``NO_SIZE``, 2 ``TOO_MUCH_CROP``)."""
    n = len(sizes)
    bucket = np.full(n, -1, np.int64)
    lost = np.zeros(n, np.float64)
    reason = np.zeros(n, np.int8)
    known = (sizes[:, 0] > 0) & (sizes[:, 1] > 0)
    reason[~known] = 1
    if known.any():
        wh = sizes[known].astype(np.float64)
        near = _nearest(sizes[known], options.shapes)
        shapes = np.array(options.shapes, np.float64)[near]  # (h, w)
        scale = np.maximum(shapes[:, 1] / wh[:, 0], shapes[:, 0] / wh[:, 1])
        kept = shapes[:, 0] * shapes[:, 1] / (wh[:, 0] * wh[:, 1] * scale * scale)
        lost[known] = 1.0 - kept
        bucket[known] = near
        crop = np.zeros(n, bool)
        crop[known] = lost[known] > options.max_crop + 1e-9
        reason[crop] = 2
        bucket[crop] = -1
    return bucket, lost, reason


@dataclass(frozen=True)
class BucketedOrder:
    """One rank's epoch stretch cut into one-bucket batches (see the module docstring)."""

    ids: np.ndarray  # delivered sample ids, batch after batch
    bounds: np.ndarray  # where each batch starts in ``ids``, and its end last
    batch_bucket: np.ndarray  # the bucket of each batch
    sample_bucket: np.ndarray  # the bucket of each delivered sample
    dropped: np.ndarray  # ids not delivered: short tails (drop_last) and skipped samples
    skipped: dict[str, int] = field(default_factory=dict)
    crop_lost: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per delivered id

    def first(self, batches: int) -> BucketedOrder:
        """Only the first ``batches`` batches; the samples of the others join ``dropped``."""
        if batches >= len(self.bounds) - 1:
            return self
        end = int(self.bounds[batches])
        return replace(
            self,
            ids=self.ids[:end],
            bounds=self.bounds[: batches + 1],
            batch_bucket=self.batch_bucket[:batches],
            sample_bucket=self.sample_bucket[:end],
            dropped=np.sort(np.concatenate([self.dropped, self.ids[end:]])),
            crop_lost=self.crop_lost[:end],
        )


def bucket_order(
    ids: np.ndarray,
    bucket: np.ndarray,
    lost: np.ndarray,
    reason: np.ndarray,
    *,
    batch_size: int,
    drop_last: bool,
) -> BucketedOrder:
    """The one-bucket batches of ``ids`` (a rank's plan order; ``bucket``, ``lost`` and
    ``reason`` per id, from ``assign_buckets``), vectorised."""
    pos = np.flatnonzero(bucket >= 0)
    b_of = bucket[pos]
    order = np.argsort(b_of, kind="stable")  # positions grouped by bucket, plan order inside
    grouped, gb = pos[order], b_of[order]
    starts = np.flatnonzero(np.r_[True, gb[1:] != gb[:-1]]) if len(gb) else np.zeros(0, int)
    ends = np.r_[starts[1:], len(gb)].astype(np.int64)
    full: list[tuple[int, int, int, int]] = []  # (completed at, bucket, lo, hi) in grouped
    tails: list[tuple[int, int, int, int]] = []
    for a, e in zip(starts.tolist(), ends.tolist(), strict=True):
        b = int(gb[a])
        n_full = (e - a) // batch_size
        for j in range(n_full):
            lo = a + j * batch_size
            full.append((int(grouped[lo + batch_size - 1]), b, lo, lo + batch_size))
        if a + n_full * batch_size < e:
            lo = a + n_full * batch_size
            tails.append((int(grouped[e - 1]), b, lo, e))
    full.sort()
    batches = full + ([] if drop_last else sorted(tails, key=lambda t: t[1]))
    sizes = np.array([hi - lo for _, _, lo, hi in batches], np.int64)
    take = (
        np.concatenate([grouped[lo:hi] for _, _, lo, hi in batches])
        if batches
        else np.zeros(0, np.int64)
    )
    dropped_pos = np.concatenate(
        [np.flatnonzero(bucket < 0)]
        + ([grouped[lo:hi] for _, _, lo, hi in tails] if drop_last else [])
    ).astype(np.int64)
    skipped = {NO_SIZE: int((reason == 1).sum()), TOO_MUCH_CROP: int((reason == 2).sum())}
    return BucketedOrder(
        ids=ids[take],
        bounds=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        batch_bucket=np.array([b for _, b, _, _ in batches], np.int64),
        sample_bucket=bucket[take],
        dropped=ids[np.sort(dropped_pos)],
        skipped={k: v for k, v in skipped.items() if v},
        crop_lost=lost[take],
    )
