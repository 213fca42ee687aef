"""Ingest on Ray: raw corpora (ImageFolder, JSONL/CSV/Parquet, WebDataset, TFRecord, LMDB)
to sharded WebDataset or Arrow datasets on any fsspec storage.

>>> from flashfeed.ingest import IngestConfig, run            # doctest: +SKIP
>>> run(IngestConfig(source="./photos", dest="s3://bucket/photos-v1"))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flashfeed.runtime.lazy import lazy_attributes

if TYPE_CHECKING:
    from .config import IngestConfig
    from .runner import IngestResult, run

# Submodules pull in large frameworks (torch, DALI, Ray): import them on first use,
# so `flashfeed --help` and other light commands start fast.
_LAZY = {
    "IngestConfig": ".config",
    "IngestResult": ".runner",
    "run": ".runner",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = ["IngestConfig", "IngestResult", "run"]
