"""The cluster tier: nodes serve each other shards from flash, each shard leaves the store once.

``PeerNode`` is one node (its ``ShardCache``, its ``PeerTier`` view of the cluster, its
``PeerServer``); ``place`` plans who reads each shard from the store and who copies it from
whom. See docs/CACHE.md, "Cluster tier".
"""

from __future__ import annotations

from .attempt import PeerAttempt, PeerError
from .auth import load_token
from .client import PeerTier
from .clusterwarm import cluster_placement, store_owners
from .discovery import peers_from, peers_from_ray
from .node import PeerNode
from .placement import Copy, Placement, place
from .server import PeerServer

__all__ = [
    "Copy",
    "PeerAttempt",
    "PeerError",
    "PeerNode",
    "PeerServer",
    "PeerTier",
    "Placement",
    "cluster_placement",
    "load_token",
    "peers_from",
    "peers_from_ray",
    "place",
    "store_owners",
]
