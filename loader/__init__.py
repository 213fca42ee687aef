"""Training-side loader: plan -> node cache -> DALI decode -> torch batches.

``Loader`` (images, DALI), ``TokenLoader`` (Arrow token sequences), ``PackedLoader``
(Parquet or JSONL documents indexed in place, packed on the fly) and ``ShardDataset`` (a
torch ``IterableDataset`` for your own transforms) share one plan, one resume state and
one stall accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashfeed.runtime.lazy import lazy_attributes

if TYPE_CHECKING:
    from .distributed import DistContext, resolve_context
    from .image.image import Loader
    from .image.pipeline import decode_device
    from .mixsource import MixtureDataset
    from .parts import LoaderParts, SharedKeywords
    from .position import PlanOptions, Position
    from .shard_dataset import ShardDataLoader, ShardDataset, collate_samples
    from .sources import CacheShardSource, LocalShardSource, ShardSource
    from .telemetry.ledger import Ledger, read_ledger
    from .telemetry.mixledger import SourceCheck, check_mixture
    from .tokens.packed import PackedLoader
    from .tokens.segments import DOC_OUTPUTS
    from .tokens.tokens import TokenLoader

# Submodules pull in large frameworks (torch, DALI, Ray): import them on first use,
# so `flashfeed --help` and other light commands start fast.
_LAZY = {
    "CacheShardSource": ".sources",
    "DOC_OUTPUTS": ".tokens.segments",
    "DistContext": ".distributed",
    "Ledger": ".telemetry.ledger",
    "Loader": ".image.image",
    "LoaderParts": ".parts",
    "LocalShardSource": ".sources",
    "MixtureDataset": ".mixsource",
    "PackedLoader": ".tokens.packed",
    "PlanOptions": ".position",
    "Position": ".position",
    "ShardDataLoader": ".shard_dataset",
    "ShardDataset": ".shard_dataset",
    "ShardSource": ".sources",
    "SharedKeywords": ".parts",
    "SourceCheck": ".telemetry.mixledger",
    "TokenLoader": ".tokens.tokens",
    "check_mixture": ".telemetry.mixledger",
    "collate_samples": ".shard_dataset",
    "decode_device": ".image.pipeline",
    "read_ledger": ".telemetry.ledger",
    "resolve_context": ".distributed",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = [
    "DOC_OUTPUTS",
    "CacheShardSource",
    "DistContext",
    "Ledger",
    "Loader",
    "LoaderParts",
    "LocalShardSource",
    "MixtureDataset",
    "PackedLoader",
    "PlanOptions",
    "Position",
    "ShardDataLoader",
    "ShardDataset",
    "ShardSource",
    "SharedKeywords",
    "SourceCheck",
    "TokenLoader",
    "check_mixture",
    "collate_samples",
    "decode_device",
    "read_ledger",
    "resolve_context",
]
