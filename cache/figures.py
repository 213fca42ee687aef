"""The node cache's own figures for a monitor: persisted counters, fills under way, bytes
held and capacity, read from the cache directory alone (no store, no loader)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flashfeed.runtime.lifeline import pid_alive

from .layout import list_dataset_dirs
from .space import recorded_capacity
from .stats import COUNTERS, read_persisted

__all__ = ["NodeCache", "read_node_cache"]


@dataclass(frozen=True)
class NodeCache:
    """The node cache's own counters (all processes, persisted by the cache) and its room."""

    counters: dict[str, float]
    fills_in_flight: int
    used_bytes: int | None
    capacity: int | None


def read_node_cache(cache_dir: str, *, used_bytes: int | None = None) -> NodeCache:
    """Counters from the cache's ``stats.json``, live fills, capacity; ``used_bytes`` as a
    loader last measured it (a directory scan here when None)."""
    persisted = read_persisted(cache_dir)
    counters = {k: float(persisted.get(k, 0) or 0) for k in COUNTERS}
    dirs = list_dataset_dirs(cache_dir)
    fills: set[tuple[str, int]] = set()  # a fill may hold two part files (shard, index)
    for d in dirs:
        for shard, path in d.parts():
            fields = os.path.basename(path).split(".")  # <shard>.<pid>.<token>
            if len(fields) >= 3 and fields[1].isdigit() and pid_alive(int(fields[1])):
                fills.add((d.key, shard))
    if used_bytes is None:
        used_bytes = sum(e.size for d in dirs for e in d.entries()) + sum(
            d.part_bytes() for d in dirs
        )
    return NodeCache(counters, len(fills), used_bytes, recorded_capacity(cache_dir))
