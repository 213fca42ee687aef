"""Node-local shard cache: one download per shard per node, verified, bounded, plan-aware.

``ShardCache`` is the library; ``flashfeed cache warm|status|verify|evict`` the commands.
"""

from __future__ import annotations

from .errors import CacheCapacityError, CacheError, CacheFullError, CachePermissionError
from .handle import CacheHandle
from .options import CacheOptions
from .progress import FillView
from .shardcache import ShardCache

__all__ = [
    "CacheCapacityError",
    "CacheError",
    "CacheFullError",
    "CacheHandle",
    "CacheOptions",
    "CachePermissionError",
    "FillView",
    "ShardCache",
]
