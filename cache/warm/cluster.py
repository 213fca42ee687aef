"""Warm every node of a Ray cluster: one task per node, pinned to it, each warming its share
(of one dataset, or of every source of a mixture).

Which node is which comes from the training launcher, not from Ray: the caller gives the
hosts in node-rank order (``--hosts`` / ``--hostfile``), and each entry is matched against
the alive Ray nodes by address (``NodeManagerAddress``, ``NodeName``) first, then by
hostname. Node rank = position in the list. Without a list, ranks follow sorted Ray node ids
(with a warning: that order need not be the launcher's).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flashfeed import storage
from flashfeed.errors import FlashfeedError
from flashfeed.plan.mixture import Mixture
from flashfeed.plan.plan import PlanOptions, Topology
from flashfeed.telemetry import default_cache_dir

from ..shardcache import ShardCache
from .nodeshare import NodeShare
from .service import ServiceWarm, warm_node_service
from .warm import WarmResult, warm_share

__all__ = [
    "RayNode",
    "ServiceWarm",
    "alive_nodes",
    "driver_storage_options",
    "map_hosts",
    "parse_hostfile",
    "parse_hosts",
    "warm_cluster",
    "warm_node",
]

log = logging.getLogger("flashfeed.cache")

"""The per-node default cache directory, read on each node by a cluster warm."""


@dataclass(frozen=True)
class RayNode:
    """An alive Ray node as ``ray.nodes()`` describes it."""

    node_id: str
    address: str
    hostname: str
    name: str = ""

    def describe(self) -> str:
        return f"{self.hostname or '?'} ({self.address or '?'}, Ray node {self.node_id[:12]})"


def alive_nodes(raw: Sequence[Mapping[str, Any]]) -> list[RayNode]:
    """The alive nodes of a ``ray.nodes()`` answer, sorted by node id."""
    nodes = [
        RayNode(
            node_id=str(n.get("NodeID", "")),
            address=str(n.get("NodeManagerAddress") or ""),
            hostname=str(n.get("NodeManagerHostname") or ""),
            name=str(n.get("NodeName") or ""),
        )
        for n in raw
        if n.get("Alive")
    ]
    return sorted(nodes, key=lambda n: n.node_id)


def _short(name: str) -> str:
    return name.split(".", 1)[0].lower()


def _is_address(entry: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in entry else socket.AF_INET, entry)
    except OSError:
        return False
    return True


def _match(entry: str, nodes: Sequence[RayNode]) -> RayNode:
    by_address = [n for n in nodes if entry in (n.address, n.name)]
    if len(by_address) == 1:
        return by_address[0]
    if len(by_address) > 1:
        raise ValueError(
            f"host {entry!r} is the address of {len(by_address)} Ray nodes: "
            + ", ".join(n.describe() for n in by_address)
        )
    by_name: list[RayNode] = []
    if not _is_address(entry):
        by_name = [n for n in nodes if n.hostname.lower() == entry.lower()]
        if not by_name:  # "node001" for "node001.cluster.local" and the other way round
            by_name = [n for n in nodes if n.hostname and _short(n.hostname) == _short(entry)]
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        raise ValueError(
            f"host {entry!r} names {len(by_name)} Ray nodes that share its hostname (nodes on "
            "one machine?): list them by address instead: " + ", ".join(n.address for n in by_name)
        )
    alive = ", ".join(n.describe() for n in nodes) or "none"
    raise ValueError(f"host {entry!r} matches no alive Ray node (alive: {alive})")


def map_hosts(
    raw_nodes: Sequence[Mapping[str, Any]], hosts: Sequence[str]
) -> tuple[list[RayNode], list[RayNode]]:
    """(the Ray node of each host, in the list's order: node rank = position; the alive Ray
    nodes the list leaves out). Raises ValueError naming an entry that matches no alive node,
    or several, or a node listed twice."""
    if not hosts:
        raise ValueError("the host list is empty")
    nodes = alive_nodes(raw_nodes)
    ranked: list[RayNode] = []
    seen: dict[str, str] = {}
    for entry in hosts:
        if not entry or entry != entry.strip():
            raise ValueError(f"host list entry {entry!r} is empty or has spaces")
        node = _match(entry, nodes)
        if node.node_id in seen:
            raise ValueError(
                f"hosts {seen[node.node_id]!r} and {entry!r} are the same Ray node "
                f"{node.describe()}: each node must be listed once"
            )
        seen[node.node_id] = entry
        ranked.append(node)
    extra = [n for n in nodes if n.node_id not in seen]
    return ranked, extra


def parse_hosts(text: str) -> list[str]:
    """``--hosts h0,h1,...``: the hosts in node-rank order."""
    hosts = [h.strip() for h in text.split(",")]
    if any(not h for h in hosts):
        raise ValueError(f"--hosts has an empty entry: {text!r}")
    return hosts


def parse_hostfile(path: str) -> list[str]:
    """One host per line, in node-rank order; ``#`` starts a comment, blank lines are
    skipped, and only a line's first word counts (``node01 slots=8`` is ``node01``)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the hostfile {path}: {exc.strerror or exc}") from None
    hosts = [words[0] for line in lines if (words := line.split("#", 1)[0].split())]
    if not hosts:
        raise ValueError(f"the hostfile {path} lists no host")
    return hosts


def driver_storage_options(given: dict[str, Any] | None) -> dict[str, Any] | None:
    """The driver's S3 settings, handed to each task as an argument: task arguments stay in
    the object store, while a runtime_env's env_vars are written into Ray's logs."""
    if given is not None:
        return given
    return storage.env_storage_options() or None


def warm_node(
    url: str | Mixture,
    cache_dir: str | None,
    share: NodeShare,
    cache_kwargs: dict[str, Any],
    batch: int = 1,
    service: ServiceWarm | None = None,
) -> dict[str, Any]:
    """Warm this machine's cache with ``share`` of the dataset at ``url`` or of every source
    of a mixture; ``cache_dir`` None: this node's default (``default_cache_dir``); with
    ``service``, through this node's service instead. A setup failure comes back as
    ``"error"``, one line."""
    if service is not None:
        return warm_node_service(url, share, cache_kwargs.get("storage_options"), batch, service)
    root = cache_dir or default_cache_dir()
    try:
        spec = cache_kwargs.get("peers")
        if spec is not None:  # cache warm --peers: the cluster tier
            from ..peer.clusterwarm import assign_owners, with_peer_tier

            cache_kwargs = with_peer_tier(cache_kwargs, node_rank=share.node_rank)
        with ShardCache(root, **cache_kwargs) as cache:
            # a dataset's manifest is kept in the cache for offline runs (a mixture's too)
            target = url if isinstance(url, Mixture) else cache.open_dataset(url)
            if spec is not None and not isinstance(target, Mixture):  # refused: warm_cluster
                assign_owners(cache_kwargs["peers"], target, spec)
            out = warm_share(cache, target, share, progress=False, batch=batch).to_dict()
            if spec is not None:
                out["peers"] = cache_kwargs["peers"].stats()
    except (FlashfeedError, ValueError, OSError) as exc:
        out = WarmResult(node_rank=share.node_rank, shards=0).to_dict()
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["host"] = socket.gethostname()
    out["cache_dir"] = root
    return out


def warm_cluster(
    url: str | Mixture,
    cache_dir: str | None,
    *,
    address: str | None,
    options: PlanOptions,
    ranks_per_node: int,
    epochs: int,
    hosts: Sequence[str] | None = None,
    num_nodes: int | None = None,
    cache_kwargs: dict[str, Any],
    warn: Callable[[str], None] = log.warning,
    batch: int = 1,
    service: ServiceWarm | None = None,
) -> list[dict[str, Any]]:
    """One Ray task per node of the run (hard node affinity), each warming its share (of
    every source, for a ``Mixture``: the nodes' shares of the mixture's plan).

    A node's rank is its position in ``hosts``, or without ``hosts`` its place among the
    alive Ray nodes sorted by id. ``num_nodes``, when given, must be that number of nodes.
    ``cache_dir`` None: each node uses its own ``FLASHFEED_CACHE_DIR``. ``batch``: the
    loader's batch size, for a mixture's plan. ``service``: each node warms through its
    node service instead of a cache directory.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address, configure_logging=False, log_to_driver=False)
    raw = ray.nodes()
    if hosts is not None:
        ranked, extra = map_hosts(raw, hosts)
        for n in extra:
            warn(f"Ray node {n.describe()} is not in the host list: not warmed")
    else:
        ranked = alive_nodes(raw)
        if not ranked:
            raise ValueError(f"the Ray cluster at {address} has no alive node")
        warn(
            f"node ranks follow Ray's node ids ({len(ranked)} nodes), which need not match "
            "the training launcher's node ranks: give --hosts or --hostfile in node-rank order"
        )
    if num_nodes is not None and num_nodes != len(ranked):
        found = "the host list names" if hosts is not None else "the Ray cluster has"
        raise ValueError(f"the run has {num_nodes} nodes but {found} {len(ranked)}")
    topology = Topology(len(ranked) * ranks_per_node, ranks_per_node)
    cache_kwargs = {
        **cache_kwargs,
        "storage_options": driver_storage_options(cache_kwargs.get("storage_options")),
    }
    shares = [NodeShare(options, topology, rank, epochs) for rank in range(len(ranked))]
    if cache_kwargs.get("peers") is not None:
        if isinstance(url, Mixture):
            raise ValueError("--peers warms one dataset; a mixture's sources: one at a time")
        from ..peer.clusterwarm import plan_store_reads

        cache_kwargs["peers"] = plan_store_reads(
            url, cache_kwargs["peers"], shares, cache_kwargs["storage_options"]
        )
    task = ray.remote(num_cpus=1, max_retries=0)(warm_node)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote(url, cache_dir, share, cache_kwargs, batch, service)
        for node, share in zip(ranked, shares, strict=True)
    ]
    results = ray.get(refs)
    for node, r in zip(ranked, results, strict=True):
        r["node_id"] = node.node_id
        r["address"] = node.address
    return results
