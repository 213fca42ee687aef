"""The exceptions the cache raises, all ``FlashfeedError`` subclasses."""

from __future__ import annotations

from flashfeed.errors import FlashfeedError

__all__ = [
    "CacheCapacityError",
    "CacheError",
    "CacheFullError",
    "CacheOverCapacityError",
    "CachePermissionError",
]


class CacheError(FlashfeedError):
    """Base class of cache failures."""


class CacheCapacityError(CacheError, ValueError):
    """The capacity cannot hold even one shard of a dataset: a configuration error."""


class CacheFullError(CacheError, OSError):
    """No room for a fill: the disk is full (ENOSPC), or every cached shard is pinned or in use."""


class CacheOverCapacityError(CacheFullError):
    """A shard cannot fit beside the pinned shards (warmed shares) whatever is evicted: the
    fill fails at once, naming what holds the room, instead of evicting a warmed share."""


class CachePermissionError(CacheError, PermissionError):
    """The cache directory is another user's, or others may write into it: refused."""
