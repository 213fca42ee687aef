"""flashfeed: corpora to sharded datasets on object storage, node-local flash caching, and a
DALI-backed loader that keeps GPUs fed.

The dataset contract lives here: ``Dataset``, ``Manifest``, the shard formats and storage.
Components: ``flashfeed.ingest``, ``flashfeed.cache``, ``flashfeed.loader``.
"""

from __future__ import annotations

from .dataset import Dataset, TarShardReader
from .errors import (
    CorruptShardError,
    DatasetExistsError,
    FlashfeedError,
    HostileInputError,
    ManifestError,
    StorageError,
)
from .manifest import FORMAT_VERSION, Manifest, ShardInfo, commit_manifest, read_manifest
from .units import format_size, parse_size

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "CorruptShardError",
    "Dataset",
    "DatasetExistsError",
    "FlashfeedError",
    "HostileInputError",
    "Manifest",
    "ManifestError",
    "ShardInfo",
    "StorageError",
    "TarShardReader",
    "__version__",
    "commit_manifest",
    "format_size",
    "parse_size",
    "read_manifest",
]
