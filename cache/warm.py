"""``cache warm``: fetch exactly the shards one node will read, in read order, before a run.

The node's shards come from the plan (``flashfeed.plan.node_shard_order``) with the run's
``PlanOptions``, ``Topology``, node rank and epochs (a ``NodeShare``), so warming, eviction's
look-ahead and training agree on what this node reads and when. A warm leaves a record in
the cache (``ShardCache.record_warm``) naming the share it fetched; a loader opening the
cache compares it with its own run (``check_warm_record``) and warns once when they differ.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

from flashfeed.dataset import Dataset
from flashfeed.plan import PlanOptions, Topology, node_shard_order

from .shardcache import ShardCache

__all__ = [
    "NodeShare",
    "WarmResult",
    "check_warm_record",
    "dataset_digest",
    "describe_warm_record",
    "fitting_prefix",
    "warm",
    "warm_mismatch",
    "warm_share",
]

loader_log = logging.getLogger("flashfeed.loader")


@dataclass(frozen=True)
class NodeShare:
    """Which node of which run: the plan's whole input for one node, plus the epochs to cover.

    ``NodeShare.build(...)`` takes the same friendly keywords as the CLI; the fields are the
    values the loaders use, so one share describes warming and reading alike.
    """

    options: PlanOptions = field(default_factory=PlanOptions)
    topology: Topology = field(default_factory=Topology)
    node_rank: int = 0
    epochs: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.options, PlanOptions):
            raise ValueError(f"options must be a PlanOptions, got {self.options!r}")
        if not isinstance(self.topology, Topology):
            raise ValueError(f"topology must be a Topology, got {self.topology!r}")
        for name in ("node_rank", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        self.topology.check_node(self.node_rank)

    @classmethod
    def build(
        cls,
        *,
        node_rank: int = 0,
        num_nodes: int | None = None,
        world_size: int | None = None,
        ranks_per_node: int = 1,
        epochs: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        window: int = 4,
        drop_last: bool = True,
    ) -> NodeShare:
        """A share from loose values: ``world_size`` or ``num_nodes`` (x ``ranks_per_node``)."""
        if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int):
            raise ValueError(f"ranks_per_node must be an integer, got {ranks_per_node!r}")
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
        if num_nodes is not None and (isinstance(num_nodes, bool) or num_nodes < 1):
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes!r}")
        if world_size is None:
            world_size = (1 if num_nodes is None else num_nodes) * ranks_per_node
        elif num_nodes is not None and world_size != num_nodes * ranks_per_node:
            raise ValueError(
                f"world_size {world_size} is not num_nodes {num_nodes} x ranks_per_node "
                f"{ranks_per_node}"
            )
        return cls(
            options=PlanOptions(seed=seed, shuffle=shuffle, window=window, drop_last=drop_last),
            topology=Topology(world_size, ranks_per_node),
            node_rank=node_rank,
            epochs=epochs,
        )

    @property
    def num_nodes(self) -> int:
        return self.topology.num_nodes

    @property
    def ranks_per_node(self) -> int:
        return self.topology.rpn

    def describe(self) -> str:
        return f"{_describe(self.topology, self.node_rank, self.options)}, {self.epochs} epochs"

    def order(self, dataset: Dataset) -> list[int]:
        """The node's shards in the order it reads them, epoch after epoch (with repeats)."""
        return node_shard_order(
            dataset.manifest.shard_samples,
            options=self.options,
            epochs=range(self.epochs),
            topology=self.topology,
            node_rank=self.node_rank,
        )

    def record(self, dataset: Dataset) -> dict[str, Any]:
        """What a cache warmed with this share records about it (see ``warm_mismatch``)."""
        return {
            "url": dataset.url.rstrip("/"),
            "dataset_digest": dataset_digest(dataset),
            "options": asdict(self.options),
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "world_size": self.topology.world_size,
            "ranks_per_node": self.ranks_per_node,
            "epochs": self.epochs,
            "time": time.time(),
            "host": socket.gethostname(),
        }


def _describe(topology: Topology, node_rank: int, options: PlanOptions) -> str:
    return (
        f"node {node_rank} of {topology.num_nodes} ({topology.rpn} ranks per node; "
        f"{options.describe()})"
    )


def dataset_digest(dataset: Dataset) -> str:
    """The manifest's digest of the shard table (paths, sizes, checksums): a warm record
    tells one version of a dataset from another."""
    return str(dataset.manifest.digest)


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
        futures = {pool.submit(cache.fetch, dataset, i): i for i in wanted}
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


def warm_share(
    cache: ShardCache,
    dataset: Dataset,
    share: NodeShare,
    *,
    progress: bool = True,
    workers: int | None = None,
    file: TextIO | None = None,
) -> WarmResult:
    """Warm ``share`` of ``dataset`` into ``cache`` (see ``warm``), then record in the cache
    which share it holds, so a loader of another share can say so."""
    result = warm(
        cache,
        dataset,
        share.order(dataset),
        node_rank=share.node_rank,
        progress=progress,
        workers=workers,
        file=file,
    )
    record = share.record(dataset)
    record.update(
        cache_dir=cache.root,
        shards=result.shards,
        fetched=result.fetched,
        already=result.already,
        over_capacity=result.over_capacity,
        failed=len(result.failed),
    )
    cache.record_warm(record)
    return result


def _recorded(record: Mapping[str, Any]) -> tuple[str | None, PlanOptions, Topology, int]:
    """(digest, options, topology, node rank) of a warm record; ValueError when malformed."""
    try:
        opts = record["options"]
        options = PlanOptions(
            seed=opts["seed"],
            shuffle=opts["shuffle"],
            window=opts["window"],
            drop_last=opts["drop_last"],
        )
        topology = Topology(record["world_size"], record["ranks_per_node"])
        node_rank = record["node_rank"]
        topology.check_node(node_rank)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"lacks or mistypes {exc}") from None
    digest = record.get("dataset_digest")
    return (digest if isinstance(digest, str) else None), options, topology, node_rank


def describe_warm_record(record: Mapping[str, Any]) -> str:
    """``warmed for node 1 of 2 (...), 3 epochs, on host at time`` for ``cache status``."""
    try:
        _, options, topology, node_rank = _recorded(record)
    except ValueError as exc:
        return f"a warm record that cannot be read ({exc})"
    when = record.get("time")
    at = (
        time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(when))
        if isinstance(when, int | float)
        else ""
    )
    host = f" on {record['host']}" if record.get("host") else ""
    return (
        f"warmed for {_describe(topology, node_rank, options)}, "
        f"{record.get('epochs', '?')} epochs{host}{at}"
    )


def warm_mismatch(
    record: Mapping[str, Any],
    *,
    dataset_digest: str | None,
    options: PlanOptions,
    topology: Topology,
    node_rank: int,
) -> str | None:
    """One line naming both sides when a cache was warmed for another share than this run's
    (or for another version of the dataset); None when they match."""
    where = f"cache at {record['cache_dir']}" if record.get("cache_dir") else "the cache"
    try:
        digest, w_options, w_topology, w_node = _recorded(record)
    except ValueError as exc:
        return f"{where} has a warm record that cannot be read ({exc}): re-run flashfeed cache warm"
    if digest and dataset_digest and digest != dataset_digest:
        return (
            f"{where} was warmed for another version of the dataset {record.get('url')} "
            f"(digest {digest[:16]}), this run reads digest {dataset_digest[:16]}: its shards "
            "will be fetched again; re-run flashfeed cache warm"
        )
    if (w_options, w_topology, w_node) == (options, topology, node_rank):
        return None
    differ = [
        name
        for name, a, b in (
            ("node rank", w_node, node_rank),
            ("number of nodes", w_topology.num_nodes, topology.num_nodes),
            ("ranks per node", w_topology.rpn, topology.rpn),
            *((f, getattr(w_options, f), getattr(options, f)) for f in _OPTION_FIELDS),
        )
        if a != b
    ]
    return (
        f"{where} was warmed for {_describe(w_topology, w_node, w_options)}, this run is "
        f"{_describe(topology, node_rank, options)}; they differ in {', '.join(differ)}: "
        "this node reads shards it was not warmed with"
    )


_OPTION_FIELDS = ("seed", "shuffle", "window", "drop_last")
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
