"""The exceptions flashfeed raises. Every one is a ``FlashfeedError``."""

from __future__ import annotations

__all__ = [
    "CorruptShardError",
    "DatasetExistsError",
    "FlashfeedError",
    "HostileInputError",
    "ManifestError",
    "StorageError",
]


class FlashfeedError(Exception):
    """Base class: catch this to handle any flashfeed failure."""


class StorageError(FlashfeedError, OSError):
    """Object storage could not be reached or refused a request (after retries)."""


class ManifestError(FlashfeedError, ValueError):
    """A manifest is missing, malformed, or of an unknown format version."""


class CorruptShardError(FlashfeedError, ValueError):
    """A shard or its index does not match what the manifest or the format promises."""


class HostileInputError(CorruptShardError):
    """Input that tries to escape its place: absolute paths, ``..``, links, devices."""


class DatasetExistsError(FlashfeedError, FileExistsError):
    """A committed dataset already stands at the destination."""
