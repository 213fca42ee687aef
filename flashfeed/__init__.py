"""flashfeed: corpora to sharded datasets on object storage, node-local flash caching, and a
DALI-backed loader that keeps GPUs fed.

The dataset contract lives here: ``Dataset``, ``Manifest``, the shard formats and storage.
Components: ``flashfeed.ingest``, ``flashfeed.cache``, ``flashfeed.loader``, and
``flashfeed.monitor`` (``flashfeed top`` and ``report``, over ``flashfeed.telemetry``).
"""

from __future__ import annotations

from flashfeed.format.manifest import (
    FORMAT_VERSION,
    Manifest,
    ShardInfo,
    commit_manifest,
    read_manifest,
)
from flashfeed.plan.mixture import Change, Mixture, Source, load_mixture

from .dataset import Dataset, TarShardReader
from .errors import (
    CorruptShardError,
    DatasetExistsError,
    FlashfeedError,
    HostileInputError,
    ManifestError,
    StorageError,
)
from .units import format_size, parse_size

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "Change",
    "CorruptShardError",
    "Dataset",
    "DatasetExistsError",
    "FlashfeedError",
    "HostileInputError",
    "Manifest",
    "ManifestError",
    "Mixture",
    "ShardInfo",
    "Source",
    "StorageError",
    "TarShardReader",
    "__version__",
    "commit_manifest",
    "format_size",
    "load_mixture",
    "parse_size",
    "read_manifest",
]
