"""Warming a node cache for a mixture: every source's shards this node reads first, in the
order the mixture's plan reads them (``flashfeed.plan.mixplan``), as far as the capacity allows.

The order is the loader's own: the same ``MixPlanner`` over the same shard tables, options,
topology and batch (a deal is cut to whole batches when the loader drops a last partial
one), node by node, epoch after epoch. Each source's warm record names the mixture.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TextIO

from tqdm import tqdm

from flashfeed.dataset import Dataset
from flashfeed.plan.mixplan import MixPlanner, SourceTable
from flashfeed.plan.mixture import Mixture

from ..errors import CacheFullError
from ..pins import pin_warmed, release_warm_pins
from ..shardcache import ShardCache
from .nodeshare import NodeShare
from .warm import WarmResult

__all__ = ["mixture_order", "open_sources", "warm_mixture"]


def open_sources(
    mixture: Mixture,
    storage_options: dict[str, Any] | None = None,
    *,
    cache: ShardCache | None = None,
) -> list[Dataset]:
    """Every source's dataset (manifests through ``cache`` when given, kept there for
    offline runs); a source that cannot be opened is named."""
    out = []
    for s in mixture.sources:
        try:
            if cache is not None:
                out.append(cache.open_dataset(s.url))
            else:
                out.append(Dataset.open(s.url, storage_options=storage_options))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"mixture source {s.key!r} ({s.url}) cannot be opened: {exc}"
            ) from None
    return out


def mixture_order(
    mixture: Mixture, datasets: Sequence[Dataset], share: NodeShare, *, batch: int = 1
) -> list[tuple[int, int]]:
    """(source number, shard) pairs this node reads, in order of first need, epoch after
    epoch (each shard once: its first need). ``batch``: the loader's batch size."""
    tables = [
        SourceTable(s.key, str(d.manifest.digest), d.manifest.shard_samples)
        for s, d in zip(mixture.sources, datasets, strict=True)
    ]
    planner = MixPlanner(
        mixture, tables, share.options, batch=batch if share.options.drop_last else 1
    )
    at = planner.start(0, share.topology)
    seen: set[int] = set()
    order: list[tuple[int, int]] = []
    for _ in range(share.epochs):
        for v in planner.node_shard_order(at, share.node_rank):
            if v not in seen:
                seen.add(v)
                s = int(planner.shard_offsets.searchsorted(v, side="right")) - 1
                order.append((s, v - int(planner.shard_offsets[s])))
        at = planner.next_epoch(at)
    return order


def warm_mixture(
    cache: ShardCache,
    mixture: Mixture,
    share: NodeShare,
    *,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    workers: int = 4,
    file: TextIO | None = None,
    batch: int = 1,
) -> WarmResult:
    """Fetch the shards of every source that this node reads first, in read order, up to
    the cache's capacity; never raises per shard (``WarmResult.failed`` names source and
    shard). Pins what it warmed (the last warm's pins of each source released first) and
    records for each source which share of which mixture was warmed. ``batch``: the
    loader's batch size (its later epochs start where the earlier ones' whole batches end)."""
    datasets = open_sources(mixture, storage_options, cache=cache)
    for d in datasets:
        release_warm_pins(cache.root, d.url)
    order = mixture_order(mixture, datasets, share, batch=batch)
    wanted, room = [], cache.capacity
    for s, i in order:
        room -= datasets[s].shards[i].bytes
        if room < 0:
            break
        wanted.append((s, i))
    cache.set_mixture_future(datasets, order)  # eviction looks ahead at the merged order
    result = WarmResult(node_rank=share.node_rank, shards=len(wanted),
                        over_capacity=len(order) - len(wanted))  # fmt: skip
    present = {(s, i) for s, i in wanted if cache.contains(datasets[s], i)}
    before, start = cache.stats(), time.monotonic()
    names = mixture.names
    with (
        tqdm(total=len(wanted), desc=f"warm node {share.node_rank}", disable=not progress,
             file=file or sys.stderr) as bar,
        ThreadPoolExecutor(workers) as pool,
    ):  # fmt: skip
        futures = {pool.submit(cache.fetch, datasets[s], i): (s, i) for s, i in wanted}
        for fut in as_completed(futures):
            s, i = futures[fut]
            try:
                fut.result()
            except CacheFullError:  # no room beside pinned or in-use shards, or a full disk
                result.over_capacity += 1
            except Exception as exc:
                where = f"{names[s]}:{datasets[s].shards[i].path}"
                result.failed[where] = f"{type(exc).__name__}: {exc}"
            else:
                pin_warmed(cache.dataset_dir(datasets[s]), i)
                result.pinned += 1
                result.already += (s, i) in present
                result.fetched += (s, i) not in present
            bar.update(1)
    after = cache.stats()
    result.seconds = time.monotonic() - start
    result.bytes_fetched = int(after["bytes_fetched"] - before["bytes_fetched"])
    for s, d in enumerate(datasets):
        record = share.record(d)
        record.update(
            cache_dir=cache.root,
            mixture=mixture.origin or mixture.digest,
            mixture_digest=mixture.digest,
            source=names[s],
            shards=sum(1 for t, _ in wanted if t == s),
            pinned=sum(1 for t, _ in wanted if t == s),
        )
        cache.record_warm(record)
    cache.counters.flush()
    return result
