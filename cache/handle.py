"""``CacheHandle``: a picklable way to open the same cache, with the same options, elsewhere.

A loader's reader processes and ``DataLoader`` workers get the handle of the loader's cache,
so every process of a node bounds, fetches and verifies alike instead of rebuilding a cache
from defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .options import CacheOptions

if TYPE_CHECKING:
    from .shardcache import ShardCache

__all__ = ["CacheHandle"]


@dataclass(frozen=True)
class CacheHandle:
    """A cache directory and every option of the ``ShardCache`` it came from.

    ``storage_options`` may hold credentials: they travel with the handle (a reader process
    needs them to fetch) but stay out of its ``repr``; so does ``peers``, the cluster tier's
    settings and token (``PeerTier.spec``), so that a reader process's misses ask the same
    peers first.
    """

    root: str
    options: CacheOptions
    storage_options: dict[str, Any] | None = field(default=None, repr=False, hash=False)
    peers: dict[str, Any] | None = field(default=None, repr=False, hash=False)

    def open(self) -> ShardCache:
        """A ``ShardCache`` of this process on the same directory, with the same options."""
        from .shardcache import ShardCache

        values = {f.name: getattr(self.options, f.name) for f in fields(self.options)}
        tier = None
        if self.peers is not None:
            from .peer.client import PeerTier

            tier = PeerTier.from_spec(self.peers)
        return ShardCache(self.root, storage_options=self.storage_options, peers=tier, **values)
