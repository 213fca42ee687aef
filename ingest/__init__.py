"""Ingest on Ray: raw corpora (ImageFolder, JSONL/CSV/Parquet, WebDataset, TFRecord, LMDB)
to sharded WebDataset or Arrow datasets on any fsspec storage.

>>> from flashfeed.ingest import IngestConfig, run            # doctest: +SKIP
>>> run(IngestConfig(source="./photos", dest="s3://bucket/photos-v1"))  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["IngestConfig", "IngestResult", "run"]
