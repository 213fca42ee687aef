"""``cache warm``: fetch exactly the shards one node will read, in read order, before a run.

The node's shards come from the plan (``flashfeed.plan.node_shard_order``) with the run's
seed, epochs and topology, so warming and training agree on what this node reads.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

from flashfeed.dataset import Dataset
from flashfeed.plan import node_shard_order

from .shardcache import ShardCache

__all__ = ["NodeShare", "WarmResult", "fitting_prefix", "warm"]


@dataclass(frozen=True)
class NodeShare:
    """Which node of which run: the plan's inputs that decide a node's shards."""

    node_rank: int = 0
    num_nodes: int = 1
    ranks_per_node: int = 1
    seed: int = 0
    epochs: int = 1

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.ranks_per_node < 1 or self.epochs < 1:
            raise ValueError(
                "num_nodes, ranks_per_node and epochs must be >= 1, got "
                f"{self.num_nodes}, {self.ranks_per_node}, {self.epochs}"
            )
        if not 0 <= self.node_rank < self.num_nodes:
            raise ValueError(f"node_rank must be in [0, {self.num_nodes}), got {self.node_rank}")

    def describe(self) -> str:
        return (
            f"node {self.node_rank} of {self.num_nodes}, {self.ranks_per_node} ranks per node, "
            f"seed {self.seed}, {self.epochs} epochs"
        )

    def order(self, dataset: Dataset) -> list[int]:
        """The node's shards in the order it reads them, epoch after epoch (with repeats)."""
        return node_shard_order(
            [s.samples for s in dataset.shards],
            seed=self.seed,
            epochs=range(self.epochs),
            world_size=self.num_nodes * self.ranks_per_node,
            ranks_per_node=self.ranks_per_node,
            node_rank=self.node_rank,
        )


def fitting_prefix(
    dataset: Dataset, order: Sequence[int], capacity: int
) -> tuple[list[int], list[int]]:
    """Distinct shards in first-use order: those that fit in ``capacity``, and the rest."""
    seen: set[int] = set()
    fits: list[int] = []
    rest: list[int] = []
    used = 0
    for i in order:
        if i in seen:
            continue
        seen.add(i)
        size = dataset.shards[i].bytes
        if not rest and used + size <= capacity:
            fits.append(i)
            used += size
        else:
            rest.append(i)
    return fits, rest


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

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _shard_workers(cache: ShardCache, dataset: Dataset, shards: Sequence[int]) -> int:
    """Shards fetched at once: enough parts to keep every request slot busy, plus one shard
    whose checksum and rename overlap the next downloads; more would finish all shards late.
    """
    if not shards:
        return 1
    sizes = sorted(dataset.shards[i].bytes for i in shards)
    parts = max(1, -(-sizes[len(sizes) // 2] // cache.options.part_size))
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
) -> WarmResult:
    """Fetch the shards of ``order`` that fit, earliest read first; never raises per shard.

    Already cached shards are verified, not fetched again, so an interrupted warm continues
    where it stopped. Failures are collected in ``WarmResult.failed`` (shard path -> error).
    """
    cache.set_future(dataset, order)
    wanted, rest = fitting_prefix(dataset, order, cache.capacity)
    result = WarmResult(node_rank=node_rank, shards=len(wanted), over_capacity=len(rest))
    present = {i for i in wanted if cache.contains(dataset, i)}
    before = cache.stats()
    start = time.monotonic()
    total = sum(dataset.shards[i].bytes for i in wanted if i not in present)
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc=f"warm node {node_rank}",
        disable=not progress,
        file=file or sys.stderr,
        smoothing=0.1,
    )
    done = 0
    with bar, ThreadPoolExecutor(workers or _shard_workers(cache, dataset, wanted)) as pool:
        futures = {pool.submit(cache.ensure, dataset, i): i for i in wanted}
        for fut in as_completed(futures):
            i = futures[fut]
            done += 1
            try:
                fut.result()
            except Exception as exc:
                result.failed[dataset.shards[i].path] = f"{type(exc).__name__}: {exc}"
            else:
                if i in present:
                    result.already += 1
                else:
                    result.fetched += 1
            if i not in present:
                bar.update(dataset.shards[i].bytes)
            bar.set_postfix(shards=f"{done}/{len(wanted)}", failed=len(result.failed))
    after = cache.stats()
    result.seconds = time.monotonic() - start
    result.bytes_fetched = int(after["bytes_fetched"] - before["bytes_fetched"])
    result.throttle_events = int(after["throttle_events"] - before["throttle_events"])
    result.lowest_concurrency = int(after["concurrency_lowest"])
    cache.counters.flush()
    return result
