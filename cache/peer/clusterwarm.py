"""The cluster warm's side of the tier: the placement of one dataset over the nodes' shares.

Each node's share (``NodeShare``: its run's plan, its rank) gives its shards in need order;
``place`` turns them, with what the nodes hold already, into one store reader per shard and
the copies between nodes. ``store_owners`` is what every node's ``PeerTier.assign`` takes, so
a miss anywhere in the cluster asks the planned node to read the shard.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

from flashfeed.dataset import Dataset

from ..layout import dataset_key
from ..warm.nodeshare import NodeShare
from .auth import load_token
from .client import PeerTier
from .placement import Placement, place

__all__ = [
    "assign_owners",
    "cluster_placement",
    "plan_store_reads",
    "store_owners",
    "with_peer_tier",
]


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
    needs: dict[Hashable, Sequence[int]] = {n: share.order(dataset) for n, share in shares.items()}
    have: dict[Hashable, Collection[int]] | None = None
    if held is not None:
        have = {n: shards for n, shards in held.items()}
    return place(needs, have, max_serving=max_serving, seed=seed)


def store_owners(placement: Placement) -> dict[int, str]:
    """Shard -> the node that reads it from the store."""
    return {shard: str(node) for shard, node in placement.store.items()}


def with_peer_tier(cache_kwargs: dict[str, Any], *, node_rank: int | None = None) -> dict[str, Any]:
    """``cache_kwargs`` for a warm's ``ShardCache`` with its ``peers`` spec
    (``{"peers": [host:port, ...], "self": host:port | None}``, from ``cache warm --peers``)
    made a ``PeerTier``. The token is this node's own (``FLASHFEED_PEER_TOKEN`` or
    ``"token_file"``). A node with a server of its own (``self``, or in a cluster warm its
    place in the list) may single-flight shards for the cluster; one without reads holders,
    then the store."""
    spec = cache_kwargs.get("peers")
    if not isinstance(spec, dict):
        return cache_kwargs
    peers = [str(p) for p in spec.get("peers", ())]
    me = spec.get("self")
    if me is None and node_rank is not None and spec.get("ranked") and node_rank < len(peers):
        me = peers[node_rank]
    token = load_token(token_file=spec.get("token_file"))
    tier = PeerTier(peers=peers, token=token, self_address=me, delegate=me is not None)
    return {**cache_kwargs, "peers": tier}


def plan_store_reads(
    url: str,
    spec: dict[str, Any],
    shares: Sequence[NodeShare],
    storage_options: dict[str, Any] | None,
) -> dict[str, Any]:
    """A cluster warm's ``--peers`` spec with the placement's store readers (``"owners"``):
    node rank ``r`` is ``spec["peers"][r]``, and reads from the store the shards the
    placement gives it. The driver reads the manifest to plan."""
    peers = list(spec["peers"])
    if len(peers) != len(shares):
        raise ValueError(
            f"--peers names {len(peers)} nodes but the cluster warm has {len(shares)}: list "
            "each node's peer server once, in node-rank order"
        )
    dataset = Dataset.open(url, storage_options=storage_options)
    placement = cluster_placement(dataset, dict(zip(peers, shares, strict=True)))
    return {**spec, "owners": store_owners(placement)}


def assign_owners(tier: PeerTier, dataset: Dataset, spec: Mapping[str, Any]) -> None:
    """Give ``tier`` the planned store readers of ``dataset`` (``plan_store_reads``)."""
    owners = spec.get("owners")
    if owners:
        tier.assign(
            dataset_key(dataset.url, dataset.manifest), {int(k): v for k, v in owners.items()}
        )
