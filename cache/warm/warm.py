"""``cache warm``: fetch exactly the shards one node will read, in read order, before a run.

The node's shards come from its ``NodeShare`` (``nodeshare.py``: the plan's input for one
node, pure), so warming, eviction's look-ahead and training agree on what this node reads
and when. This module does the fetching: ``warm`` fills the cache in read order, and
``warm_share`` leaves a record in the cache (``ShardCache.record_warm``) naming the share
it fetched; a loader opening the cache compares it with its own run (``check_warm_record``)
and warns once when they differ.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture
from flashfeed.plan.plan import PlanOptions, Topology

from ..errors import CacheFullError
from ..pins import pin_warmed, release_warm_pins
from ..shardcache import ShardCache
from .nodeshare import (
    NodeShare,
    dataset_digest,
    describe_warm_record,
    fitting_pairs,
    fitting_prefix,
    warm_mismatch,
)
from .units import ShareUnits, share_units

__all__ = [
    "NodeShare",
    "WarmResult",
    "check_warm_record",
    "dataset_digest",
    "describe_warm_record",
    "fitting_prefix",
    "warm",
    "warm_mismatch",
    "warm_pairs",
    "warm_share",
]

loader_log = logging.getLogger("flashfeed.loader")


@dataclass
class WarmResult:
    """What one node's warm did."""

    node_rank: int
    shards: int
    already: int = 0
    fetched: int = 0
    over_capacity: int = 0
    bytes_fetched: int = 0
    seconds: float = 0.0
    throttle_events: int = 0
    lowest_concurrency: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    host: str = ""
    pinned: int = 0
    pinned_per: list[int] = field(default_factory=list)  # per dataset of the warm

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["pinned_per"]  # the records per dataset hold it
        return out


def _shard_workers(cache: ShardCache, sizes: Sequence[int]) -> int:
    """Shards fetched at once: enough parts to keep every request slot busy, plus one shard
    whose checksum and rename overlap the next downloads; more would finish all shards late.
    """
    if not sizes:
        return 1
    ordered = sorted(sizes)
    parts = max(1, -(-ordered[len(ordered) // 2] // cache.options.part_size))
    return max(1, -(-cache.options.concurrency // parts)) + 1


def warm(
    cache: ShardCache,
    dataset: Dataset,
    order: Sequence[int],
    *,
    node_rank: int = 0,
    progress: bool = True,
    workers: int | None = None,
    file: TextIO | None = None,
    pin: bool = False,
) -> WarmResult:
    """Fetch the shards of ``order`` that fit, earliest read first; never raises per shard
    (``warm_pairs`` of a dataset alone)."""
    return warm_pairs(cache, ShareUnits((dataset,), [(0, int(i)) for i in order]),
                      node_rank=node_rank, progress=progress, workers=workers, file=file,
                      pin=pin)  # fmt: skip


def warm_pairs(
    cache: ShardCache,
    units: ShareUnits,
    *,
    node_rank: int = 0,
    progress: bool = True,
    workers: int | None = None,
    file: TextIO | None = None,
    pin: bool = False,
) -> WarmResult:
    """Fetch the ``(dataset, shard)`` pairs of ``units.order`` that fit, earliest read first;
    never raises per shard.

    Already cached shards are verified, not fetched again, so an interrupted warm continues
    where it stopped. Failures are collected in ``WarmResult.failed`` (shard path, with its
    source's name in a mixture -> error); shards with no room (beyond the capacity, or
    beside pinned shards) count as ``over_capacity``. ``pin``: pin each shard once it is
    here (``pins.py``); ``WarmResult.pinned_per`` counts them per dataset.
    """
    datasets, names = units.datasets, units.names
    if len(datasets) == 1:
        cache.set_future(datasets[0], [i for _, i in units.order])
    else:  # eviction compares the sources' shards on one clock
        cache.set_mixture_future(datasets, units.first_needs())
    wanted, rest = fitting_pairs(datasets, units.order, cache.capacity)
    result = WarmResult(node_rank=node_rank, shards=len(wanted), over_capacity=len(rest))
    result.pinned_per = [0] * len(datasets)
    present = {(s, i) for s, i in wanted if cache.contains(datasets[s], i)}
    before = cache.stats()
    start = time.monotonic()
    sizes = [datasets[s].shards[i].bytes for s, i in wanted]
    total = sum(n for p, n in zip(wanted, sizes, strict=True) if p not in present)
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000,
               desc=f"warm node {node_rank}", disable=not progress, file=file or sys.stderr,
               smoothing=0.1)  # fmt: skip
    done = 0
    with bar, ThreadPoolExecutor(workers or _shard_workers(cache, sizes)) as pool:
        futures = {pool.submit(cache.fetch, datasets[s], i): (s, i) for s, i in wanted}
        for fut in as_completed(futures):
            s, i = futures[fut]
            done += 1
            try:
                fut.result()
            except CacheFullError:  # no room beside pinned or in-use shards, or a full disk
                result.over_capacity += 1
            except Exception as exc:
                where = datasets[s].shards[i].path
                where = where if names is None else f"{names[s]}:{where}"
                result.failed[where] = f"{type(exc).__name__}: {exc}"
            else:
                if pin:
                    pin_warmed(cache.dataset_dir(datasets[s]), i)
                    result.pinned += 1
                    result.pinned_per[s] += 1
                if (s, i) in present:
                    result.already += 1
                else:
                    result.fetched += 1
            if (s, i) not in present:
                bar.update(datasets[s].shards[i].bytes)
            bar.set_postfix(shards=f"{done}/{len(wanted)}", failed=len(result.failed))
    after = cache.stats()
    result.seconds = time.monotonic() - start
    result.bytes_fetched = int(after["bytes_fetched"] - before["bytes_fetched"])
    result.throttle_events = int(after["throttle_events"] - before["throttle_events"])
    result.lowest_concurrency = int(after["concurrency_lowest"])
    cache.counters.flush()
    return result


def warm_share(
    cache: ShardCache,
    target: Dataset | Mixture,
    share: NodeShare,
    *,
    progress: bool = True,
    workers: int | None = None,
    file: TextIO | None = None,
    batch: int = 1,
) -> WarmResult:
    """Warm ``share`` of ``target`` (a dataset, or a mixture: every source's shards this node
    reads first) into ``cache`` (see ``warm_pairs``), pin what it warmed (the last warm's
    pins of each dataset are released first), then record in the cache which share of
    each dataset it holds, so a loader of another share can say so. ``batch``: the loader's
    batch size, for a mixture's plan."""
    units = share_units(target, share, batch=batch, cache=cache)
    for d in units.datasets:
        release_warm_pins(cache.root, d.url)
    result = warm_pairs(cache, units, node_rank=share.node_rank, progress=progress,
                        workers=workers, file=file, pin=True)  # fmt: skip
    wanted = Counter(s for s, _ in units.first_needs()[: result.shards])
    for s, d in enumerate(units.datasets):
        record = share.record(d)
        record.update(
            cache_dir=cache.root,
            shards=wanted[s],
            fetched=result.fetched,
            already=result.already,
            over_capacity=result.over_capacity,
            failed=len(result.failed),
            pinned=result.pinned_per[s],
        )
        mixture = units.mixture
        if mixture is not None:
            record.update(mixture=mixture.origin or mixture.digest,
                          mixture_digest=mixture.digest, source=mixture.names[s])  # fmt: skip
        cache.record_warm(record)
    return result


_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_warm_record(
    cache: ShardCache,
    dataset: Dataset,
    options: PlanOptions,
    topology: Topology,
    node_rank: int,
) -> str | None:
    """A loader opening ``cache``: compare the cache's warm record for ``dataset`` with this
    run and log one WARNING (on ``flashfeed.loader``, once per process) when they differ.
    Returns the message, or None when the cache was never warmed for it or matches."""
    record = cache.warm_record(dataset.url)
    if record is None:
        return None
    message = warm_mismatch(
        record,
        dataset_digest=dataset_digest(dataset),
        options=options,
        topology=topology,
        node_rank=node_rank,
    )
    if message is not None:
        with _warned_lock:
            first = message not in _warned
            _warned.add(message)
        if first:
            loader_log.warning("%s", message)
    return message
