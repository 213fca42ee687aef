"""The cluster warm's side of the tier: the placement of one dataset over the nodes' shares.

Each node's share (``NodeShare``: its run's plan, its rank) gives its shards in need order;
``place`` turns them, with what the nodes hold already, into one store reader per shard and
the copies between nodes. ``store_owners`` is what every node's ``PeerTier.assign`` takes, so
a miss anywhere in the cluster asks the planned node to read the shard.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from flashfeed.cache.nodeshare import NodeShare
from flashfeed.cache.peer.placement import Placement, place
from flashfeed.dataset import Dataset

__all__ = ["cluster_placement", "store_owners"]


def cluster_placement(
    dataset: Dataset,
    shares: Mapping[str, NodeShare],
    held: Mapping[str, Collection[int]] | None = None,
    *,
    max_serving: int = 4,
    seed: int = 0,
) -> Placement:
    """The placement of ``dataset`` over nodes (``host:port`` -> its share; several runs of
    a sweep are several shares)."""
    needs = {node: share.order(dataset) for node, share in shares.items()}
    return place(needs, held, max_serving=max_serving, seed=seed)


def store_owners(placement: Placement) -> dict[int, str]:
    """Shard -> the node that reads it from the store."""
    return {shard: str(node) for shard, node in placement.store.items()}
