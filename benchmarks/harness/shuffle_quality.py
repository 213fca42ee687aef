"""How well a read order mixes classes: label entropy per batch against the ideal.

On a class-sorted dataset (one class per shard) a shard-local buffer shuffle gives batches
of one or two classes; a perfect global shuffle gives batches whose label entropy matches
a uniformly random permutation. ``quality`` is the ratio of the two (1.0 = ideal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flashfeed.plan.plan import PlanOptions, Topology, plan_epoch

__all__ = [
    "ShuffleQuality",
    "batch_entropy",
    "buffer_shuffle_order",
    "plan_shuffle_quality",
    "shuffle_quality",
]


@dataclass(frozen=True)
class ShuffleQuality:
    """Mean per-batch label entropy (bits), the same for a random permutation, their ratio,
    and the mean number of distinct classes per batch."""

    entropy: float
    ideal: float
    quality: float
    classes_per_batch: float


def batch_entropy(labels: np.ndarray, batch_size: int) -> np.ndarray:
    """Shannon entropy (bits) of the labels of each full batch of ``labels`` in order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    labels = np.asarray(labels)
    n = len(labels) // batch_size
    if n == 0:
        raise ValueError(f"need at least one full batch of {batch_size}, got {len(labels)}")
    _, codes = np.unique(labels[: n * batch_size], return_inverse=True)
    batches = codes.reshape(n, batch_size)
    out = np.empty(n)
    for i, b in enumerate(batches):
        p = np.bincount(b) / batch_size
        p = p[p > 0]
        out[i] = float(-(p * np.log2(p)).sum())
    return out


def _classes(labels: np.ndarray, batch_size: int) -> float:
    n = len(labels) // batch_size
    rows = np.asarray(labels)[: n * batch_size].reshape(n, batch_size)
    return float(np.mean([len(np.unique(r)) for r in rows]))


def shuffle_quality(
    labels_in_order: np.ndarray, *, batch_size: int, seed: int = 0
) -> ShuffleQuality:
    """Score an order of labels against a uniformly random permutation of the same labels."""
    labels = np.asarray(labels_in_order)
    ideal_order = np.random.default_rng(seed).permutation(labels)
    got = float(batch_entropy(labels, batch_size).mean())
    ideal = float(batch_entropy(ideal_order, batch_size).mean())
    return ShuffleQuality(
        entropy=got,
        ideal=ideal,
        quality=got / ideal if ideal > 0 else 1.0,
        classes_per_batch=_classes(labels, batch_size),
    )


def buffer_shuffle_order(
    shard_sizes: Sequence[int], *, buffer_size: int, seed: int = 0, shuffle_shards: bool = True
) -> np.ndarray:
    """The order a streaming shuffle buffer produces (webdataset ``shuffle(n)``, DALI's
    ``initial_fill``): shards read one after another, each sample swapped out of a buffer."""
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(shard_sizes)])
    shards = rng.permutation(len(shard_sizes)) if shuffle_shards else np.arange(len(shard_sizes))
    stream = np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in shards])
    buf: list[int] = []
    out: list[int] = []
    for x in stream.tolist():
        if len(buf) < buffer_size:
            buf.append(x)
            continue
        j = int(rng.integers(len(buf)))
        out.append(buf[j])
        buf[j] = x
    rng.shuffle(buf)
    return np.array(out + buf, dtype=np.int64)


def plan_shuffle_quality(
    shard_sizes: Sequence[int],
    labels: np.ndarray,
    *,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    window: int = 4,
    world_size: int = 1,
    rank: int = 0,
) -> ShuffleQuality:
    """The score of the flashfeed plan's order for one rank (labels by global sample id)."""
    plan = plan_epoch(
        shard_sizes,
        options=PlanOptions(seed=seed, window=window),
        epoch=epoch,
        topology=Topology(world_size),
    )
    return shuffle_quality(np.asarray(labels)[plan.per_rank[rank]], batch_size=batch_size)
