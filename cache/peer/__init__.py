"""The cluster tier: nodes serve each other shards from flash, each shard leaves the store once.

``PeerNode`` is one node (its ``ShardCache``, its ``PeerTier`` view of the cluster, its
``PeerServer``); ``place`` plans who reads each shard from the store and who copies it from
whom; ``warm_sweep`` warms a sweep's jobs on one such plan. See docs/CACHE.md, "Cluster
tier".
"""

from __future__ import annotations

from .attempt import PeerAttempt, PeerError
from .auth import load_token
from .client import PeerTier
from .clusterwarm import cluster_placement, store_owners
from .discovery import peers_from, peers_from_ray
from .holdings import HoldingsLog
from .node import PeerNode
from .placement import Copy, Placement, place
from .server import PeerServer
from .sweep import Sweep, load_sweep, parse_sweep, plan_sweep
from .sweepwarm import warm_sweep

__all__ = [
    "Copy",
    "HoldingsLog",
    "PeerAttempt",
    "PeerError",
    "PeerNode",
    "PeerServer",
    "PeerTier",
    "Placement",
    "Sweep",
    "cluster_placement",
    "load_sweep",
    "load_token",
    "parse_sweep",
    "peers_from",
    "peers_from_ray",
    "place",
    "plan_sweep",
    "store_owners",
    "warm_sweep",
]
