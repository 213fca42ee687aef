"""Warm pins: a warmed share's reservation in the node cache.

``cache warm`` pins every shard of the share it warmed (``.pins/<i>.warm`` beside the shard),
so that fills of other datasets on the node never evict it; they evict unpinned shards, and
a shard that cannot fit beside the pins fails at once as over capacity
(``CacheOverCapacityError``). A new warm of the dataset replaces its pins (of every version
at that URL); ``cache evict`` releases them. Pins made with ``ShardCache.pin`` are the
user's and are left alone.
"""

from __future__ import annotations

import os

from .layout import DatasetDir, list_dataset_dirs

__all__ = ["pin_warmed", "release_warm_pins"]


def pin_warmed(d: DatasetDir, shard: int) -> None:
    """Pin ``shard`` of the dataset in ``d`` as part of a warmed share."""
    fd = os.open(d.warm_pin_path(shard), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)


def release_warm_pins(root: str, url: str | None = None) -> int:
    """Remove the warm pins of the dataset at ``url`` (every version of it), or of every
    dataset when ``url`` is None; returns how many were released."""
    released = 0
    for d in list_dataset_dirs(root):
        if url is not None and d.url != url.rstrip("/"):
            continue
        for shard in d.pinned(warm_only=True):
            try:
                os.unlink(d.warm_pin_path(shard))
                released += 1
            except FileNotFoundError:
                pass
    return released
