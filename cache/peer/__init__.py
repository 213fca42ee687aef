"""The cluster tier: nodes serve each other shards from flash, each shard leaves the store once.

``place`` plans who reads each shard from the store and who copies it from whom.
"""

from __future__ import annotations

from flashfeed.cache.peer.placement import Copy, Placement, place

__all__ = ["Copy", "Placement", "place"]
