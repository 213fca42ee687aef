"""What a cache directory holds, as its peer server announces it: per dataset key, the shard
count, the complete shards and the fills running now (encrypted datasets left out)."""

from __future__ import annotations

from flashfeed.crypto import is_encrypted

from ..layout import DatasetDir, list_dataset_dirs

__all__ = ["scan_holdings"]


def scan_holdings(
    root: str, dirs: dict[str, DatasetDir]
) -> tuple[dict[str, tuple[int, list[int]]], dict[str, list[int]]]:
    """(key -> (shard count, complete shards), key -> fills running) of the cache at
    ``root``; ``dirs`` keeps each dataset's ``DatasetDir`` (and its table of shard paths)
    from one scan to the next."""
    held: dict[str, tuple[int, list[int]]] = {}
    filling: dict[str, list[int]] = {}
    for listed in list_dataset_dirs(root):
        d = dirs.setdefault(listed.key, listed)
        try:
            manifest = d.manifest
        except Exception:  # a dataset directory being written: announced next time
            continue
        if is_encrypted(manifest):
            continue
        count = len(manifest.shards)
        complete = d.held_shards()
        held[d.key] = (count, complete)
        running = {s for s, p in d.parts() if p.endswith(".live") and s < count} - set(complete)
        if running:
            filling[d.key] = sorted(running)
    return held, filling
