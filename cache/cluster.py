"""Warm every node of a Ray cluster: one task per node, pinned to it, each warming its share."""

from __future__ import annotations

import os
import socket
from typing import Any

from flashfeed.dataset import Dataset

from .shardcache import ShardCache
from .warm import NodeShare, warm

__all__ = ["warm_cluster", "warm_node"]


def _driver_storage_options(given: dict[str, Any] | None) -> dict[str, Any] | None:
    """The driver's S3 settings, handed to each task as an argument: task arguments stay in
    the object store, while a runtime_env's env_vars are written into Ray's logs."""
    if given is not None:
        return given
    opts: dict[str, Any] = {}
    if os.environ.get("AWS_ENDPOINT_URL"):
        opts["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        opts["key"] = os.environ["AWS_ACCESS_KEY_ID"]
        opts["secret"] = os.environ.get("AWS_SECRET_ACCESS_KEY")
    return opts or None


def warm_node(
    url: str, cache_dir: str, share: NodeShare, cache_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Warm this machine's cache with the share of node ``share.node_rank``."""
    dataset = Dataset.open(url, storage_options=cache_kwargs.get("storage_options"))
    with ShardCache(cache_dir, **cache_kwargs) as cache:
        result = warm(
            cache, dataset, share.order(dataset), node_rank=share.node_rank, progress=False
        )
    out = result.to_dict()
    out["host"] = socket.gethostname()
    return out


def warm_cluster(
    url: str,
    cache_dir: str,
    *,
    address: str | None,
    seed: int,
    epochs: int,
    ranks_per_node: int,
    cache_kwargs: dict[str, Any],
) -> list[dict[str, Any]]:
    """One Ray task per alive node (hard node affinity); node ranks follow sorted node ids."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address, configure_logging=False, log_to_driver=False)
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    if not nodes:
        raise RuntimeError(f"the Ray cluster at {address} has no alive node")
    cache_kwargs = {
        **cache_kwargs,
        "storage_options": _driver_storage_options(cache_kwargs.get("storage_options")),
    }
    task = ray.remote(num_cpus=1, max_retries=0)(warm_node)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(
            url,
            cache_dir,
            NodeShare(
                node_rank=rank,
                num_nodes=len(nodes),
                ranks_per_node=ranks_per_node,
                seed=seed,
                epochs=epochs,
            ),
            cache_kwargs,
        )
        for rank, node_id in enumerate(nodes)
    ]
    results = ray.get(refs)
    for node_id, r in zip(nodes, results, strict=True):
        r["node_id"] = node_id
    return results
