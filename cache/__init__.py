"""Node-local shard cache: one download per shard per node, verified, bounded, plan-aware.

``ShardCache`` is the library; ``flashfeed cache warm|status|verify|evict`` the commands.
"""

from __future__ import annotations

from .errors import (
    CacheCapacityError,
    CacheError,
    CacheFullError,
    CacheOverCapacityError,
    CachePermissionError,
)
from .fetch.needorder import ShardNeed
from .figures import NodeCache, read_node_cache
from .handle import CacheHandle
from .manifests import node_manifest
from .node import NodeShardSource
from .options import CacheOptions
from .progress import FillView
from .shardcache import ShardCache
from .view import DatasetView, PartialShard
from .warm.warm import check_warm_record

__all__ = [
    "CacheCapacityError",
    "CacheError",
    "CacheFullError",
    "CacheHandle",
    "CacheOptions",
    "CacheOverCapacityError",
    "CachePermissionError",
    "DatasetView",
    "FillView",
    "NodeCache",
    "NodeShardSource",
    "PartialShard",
    "ShardCache",
    "ShardNeed",
    "check_warm_record",
    "node_manifest",
    "read_node_cache",
]
