"""Ingest on Ray: raw corpora (ImageFolder, JSONL/CSV/Parquet, WebDataset, TFRecord, LMDB)
to sharded WebDataset or Arrow datasets on any fsspec storage.

>>> from flashfeed.ingest import IngestConfig, run            # doctest: +SKIP
>>> run(IngestConfig(source="./photos", dest="s3://bucket/photos-v1"))  # doctest: +SKIP
"""

from __future__ import annotations

from .config import IngestConfig
from .runner import IngestResult, run

__all__ = ["IngestConfig", "IngestResult", "run"]
