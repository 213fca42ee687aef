"""The cluster tier: nodes serve each other shards from flash, each shard leaves the store once.

``PeerNode`` is one node (its ``ShardCache``, its ``PeerTier`` view of the cluster, its
``PeerServer``); ``place`` plans who reads each shard from the store and who copies it from
whom. See docs/CACHE.md, "Cluster tier".
"""

from __future__ import annotations

from flashfeed.cache.peer.attempt import PeerAttempt, PeerError
from flashfeed.cache.peer.auth import load_token
from flashfeed.cache.peer.client import PeerTier
from flashfeed.cache.peer.clusterwarm import cluster_placement, store_owners
from flashfeed.cache.peer.discovery import peers_from, peers_from_ray
from flashfeed.cache.peer.node import PeerNode
from flashfeed.cache.peer.placement import Copy, Placement, place
from flashfeed.cache.peer.server import PeerServer

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
