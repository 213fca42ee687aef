"""Which shards one node reads, in which order: the pure planning side of ``cache warm``.

A ``NodeShare`` is the plan's whole input for one node (``PlanOptions``, ``Topology``, node
rank, epochs); ``NodeShare.order`` asks ``flashfeed.plan.node_shard_order`` for the node's
shards, so warming, eviction's look-ahead and training agree on what this node reads and
when. A warm record (``NodeShare.record``) names the share a cache was warmed for;
``warm_mismatch`` compares one with a run. Nothing here touches a cache or the network:
``warm.py`` does the fetching.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flashfeed.dataset import Dataset
from flashfeed.plan.plan import PlanOptions, Topology, node_shard_order

__all__ = [
    "NodeShare",
    "dataset_digest",
    "describe_warm_record",
    "fitting_pairs",
    "fitting_prefix",
    "warm_mismatch",
]

_OPTION_FIELDS = ("seed", "shuffle", "window", "drop_last")


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
    fits, rest = fitting_pairs([dataset], [(0, i) for i in order], capacity)
    return [i for _, i in fits], [i for _, i in rest]


def fitting_pairs(
    datasets: Sequence[Dataset], order: Sequence[tuple[int, int]], capacity: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``fitting_prefix`` of ``(dataset number, shard)`` pairs: a dataset's or a mixture's."""
    fits: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    used = 0
    for s, i in dict.fromkeys(order):
        size = datasets[s].shards[i].bytes
        if not rest and used + size <= capacity:
            fits.append((s, i))
            used += size
        else:
            rest.append((s, i))
    return fits, rest


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
