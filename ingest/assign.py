"""Pure, seeded shard assignment: which items go to which shard, in which order. No I/O."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

__all__ = ["GROUP_SHARDS", "assign_shards", "item_order", "shard_groups", "size_spread"]

#: the most shards one ingest task builds in turn (progress is reported as tasks end)
GROUP_SHARDS = 8


def item_order(n: int, *, seed: int, shuffle: bool) -> np.ndarray:
    """Positions ``0..n-1`` in output order: a seeded permutation, or source order."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def assign_shards(
    sizes: Sequence[int],
    *,
    target_bytes: int,
    samples_per_shard: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Split items (by position) into shards, in a seeded order.

    With ``samples_per_shard`` every shard but the last holds exactly that many. Otherwise a
    shard closes when one more item would take it further past ``target_bytes`` than it stands
    below it: each shard is within half an item of the target, the last one takes the rest.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be > 0, got {target_bytes}")
    if samples_per_shard is not None and samples_per_shard <= 0:
        raise ValueError(f"samples_per_shard must be > 0, got {samples_per_shard}")
    order = item_order(len(sizes), seed=seed, shuffle=shuffle)
    if samples_per_shard is not None:
        listed = order.tolist()
        return [listed[i : i + samples_per_shard] for i in range(0, len(listed), samples_per_shard)]
    ordered = np.maximum(np.asarray(sizes, dtype=np.int64).reshape(-1)[order], 0)
    return [order[a:b].tolist() for a, b in _cuts(ordered, target_bytes)]


def _cuts(sizes: np.ndarray, target: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each shard over ``sizes`` in order: per shard, one search for the
    item at which it reaches ``target``, not a step per item (a corpus of short documents
    has a million). That item stays in the shard unless it would take the shard further
    past the target than the shard stands below it without it."""
    cum = np.cumsum(sizes)
    n = len(sizes)
    cuts = []
    start, base = 0, 0
    while start < n:
        j = int(np.searchsorted(cum, base + target, side="left"))  # reaches the target
        if j >= n:
            cuts.append((start, n))
            break
        below = int(cum[j - 1]) - base if j > start else 0
        over = below + int(sizes[j]) - target
        end = j if j > start and over > 0 and over > target - below else j + 1
        cuts.append((start, end))
        start, base = end, int(cum[end - 1])
    return cuts


def size_spread(shard_sizes: Sequence[int], target_bytes: int) -> float:
    """The largest relative distance from the target among all shards but the last."""
    body = shard_sizes[:-1]
    if not body:
        return 0.0
    return max(abs(s - target_bytes) / target_bytes for s in body)


def shard_groups(shards: int, cpus: int) -> list[range]:
    """Shards ``0..shards-1`` as runs of consecutive numbers, one ingest task each: as few
    as keep every CPU busy (a task uploads each shard while it builds the next, so a run
    hides every upload but its last), of at most ``GROUP_SHARDS``, sizes within one. More
    runs than CPUs come in whole waves (a multiple of ``cpus``), so every CPU builds as many
    shards as the others: 17 shards on 2 CPUs are 4 runs (8 or 9 shards a CPU), not 3 (11
    on one CPU while the other idles after 6)."""
    if shards < 0:
        raise ValueError(f"shards must be >= 0, got {shards}")
    if cpus < 1:
        raise ValueError(f"cpus must be >= 1, got {cpus}")
    groups = max(min(shards, cpus), -(-shards // GROUP_SHARDS))
    if groups > cpus:
        groups = min(shards, -(-groups // cpus) * cpus)
    bounds = [shards * g // groups for g in range(groups + 1)] if groups else [0]
    return [range(a, b) for a, b in pairwise(bounds)]
