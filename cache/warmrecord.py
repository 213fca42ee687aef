"""``<root>/warm.json``: for which node share each dataset of a cache was warmed.

One record per dataset URL (the last warm wins), written by ``cache warm`` through
``ShardCache.record_warm`` and read by the loader (``ShardCache.warm_record``) and by
``flashfeed cache status``. Updates are read-modify-write under a lock, so two warms of
different datasets into one cache keep both records.
"""

from __future__ import annotations

import os
from typing import Any

from flashfeed.runtime.files import atomic_write_json

from .layout import make_private_dir, read_json
from .locks import locked

__all__ = ["read_warm_records", "warm_record_path", "write_warm_record"]

_VERSION = 1


def warm_record_path(root: str) -> str:
    return os.path.join(root, "warm.json")


def read_warm_records(root: str) -> dict[str, dict[str, Any]]:
    """Dataset URL -> its warm record; empty when none was written or the file is unreadable."""
    raw = read_json(warm_record_path(root))
    if not isinstance(raw, dict) or raw.get("version") != _VERSION:
        return {}
    datasets = raw.get("datasets")
    if not isinstance(datasets, dict):
        return {}
    return {k: v for k, v in datasets.items() if isinstance(k, str) and isinstance(v, dict)}


def write_warm_record(root: str, record: dict[str, Any]) -> None:
    """Store ``record`` (which names its dataset under ``"url"``) in place of that dataset's."""
    url = record.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError(f"a warm record must name its dataset URL, got {url!r}")
    path = warm_record_path(root)
    lock = os.path.join(make_private_dir(os.path.join(root, ".locks")), "warm.lock")
    with locked(lock):
        datasets = read_warm_records(root)
        datasets[url.rstrip("/")] = record
        atomic_write_json(path, {"version": _VERSION, "datasets": datasets})
