"""Training-side loader: plan -> node cache -> DALI decode -> torch batches.

``Loader`` (images, DALI), ``TokenLoader`` (Arrow token sequences) and ``ShardDataset``
(a torch ``IterableDataset`` for your own transforms) share one plan, one resume state and
one stall accounting.
"""

from __future__ import annotations

from .distributed import DistContext, resolve_context
from .image import Loader
from .ledger import Ledger, read_ledger
from .pipeline import decode_device
from .position import PlanOptions, Position
from .shard_dataset import ShardDataLoader, ShardDataset, collate_samples
from .sources import CacheShardSource, LocalShardSource, ShardSource
from .tokens import TokenLoader

__all__ = [
    "CacheShardSource",
    "DistContext",
    "Ledger",
    "Loader",
    "LocalShardSource",
    "PlanOptions",
    "Position",
    "ShardDataLoader",
    "ShardDataset",
    "ShardSource",
    "TokenLoader",
    "collate_samples",
    "decode_device",
    "read_ledger",
    "resolve_context",
]
