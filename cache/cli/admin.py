"""What ``cache status``, ``verify`` and ``evict`` do to a cache directory, as functions."""

from __future__ import annotations

import os
from typing import Any

from flashfeed import storage
from flashfeed.crypto import cached_info
from flashfeed.dataset import Dataset

from ..layout import DatasetDir, list_dataset_dirs, read_json
from ..pins import release_warm_pins
from ..space import SpaceManager, recorded_capacity, remove_entry, sweep_dead_parts
from ..stats import Counters, read_persisted
from ..warm.nodeshare import NodeShare, fitting_prefix, warm_mismatch
from ..warmrecord import read_warm_records

__all__ = ["evict", "find_dataset_dir", "status", "verify"]


def _capacity(root: str) -> int | None:
    """The cache's recorded capacity (the one every process opening it adopts)."""
    return recorded_capacity(root)


def find_dataset_dir(root: str, url: str) -> DatasetDir | None:
    """The cache directory holding the dataset at ``url`` (the newest if several)."""
    found = [d for d in list_dataset_dirs(root) if d.url == url.rstrip("/")]
    found.sort(key=lambda d: os.stat(d.manifest_path).st_mtime)
    return found[-1] if found else None


def _dataset_status(
    d: DatasetDir, capacity: int | None, share: NodeShare | None, limit: int
) -> dict[str, Any]:
    manifest = d.manifest
    entries = {e.shard: e for e in d.entries()}
    out: dict[str, Any] = {
        "url": d.url,
        "key": d.key,
        "shards": len(manifest.shards),
        "dataset_bytes": manifest.num_bytes,
        "cached_shards": len(entries),
        "cached_bytes": sum(e.size for e in entries.values()),
        "version": manifest.digest,
        "pinned": sum(e.pinned for e in entries.values()),
        "pinned_bytes": sum(e.size for e in entries.values() if e.pinned),
        "warm_pinned": len(d.pinned(warm_only=True) & entries.keys()),
    }
    dataset = Dataset(d.url, manifest)
    if share is not None:
        order, source = share.order(dataset), f"plan: {share.describe()}"
    else:
        order = (read_json(d.future_path) or {}).get("order") or []
        source = "the last read order given to the cache"
    if order:
        distinct = list(dict.fromkeys(order))
        need = sum(manifest.shards[i].bytes for i in distinct)
        fits, rest = fitting_prefix(dataset, order, capacity or need)
        out["share"] = {
            "source": source,
            "shards": len(distinct),
            "bytes": need,
            "fits": capacity is not None and need <= capacity,
            "cached": sum(i in entries for i in distinct),
            "over_capacity": len(rest),
        }
        out["next"] = [manifest.shards[i].path for i in fits if i not in entries][:limit]
    return out


def status(
    root: str, *, url: str | None = None, share: NodeShare | None = None, limit: int = 10
) -> dict[str, Any]:
    """Capacity, use, node-wide counters, and per dataset: cached share, fit, next shards."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no cache directory at {root}")
    capacity = _capacity(root)
    dirs = list_dataset_dirs(root)
    if url is not None:
        d = find_dataset_dir(root, url)
        if d is None:
            dataset = Dataset.open(url)
            out_ds = {
                "url": url,
                "shards": len(dataset.shards),
                "dataset_bytes": dataset.manifest.num_bytes,
                "cached_shards": 0,
                "cached_bytes": 0,
            }
            if share is not None:
                order = share.order(dataset)
                need = sum(dataset.shards[i].bytes for i in set(order))
                out_ds["share"] = {
                    "source": f"plan: {share.describe()}",
                    "shards": len(set(order)),
                    "bytes": need,
                    "fits": capacity is not None and need <= capacity,
                    "cached": 0,
                }
            datasets = [out_ds]
        else:
            datasets = [_dataset_status(d, capacity, share, limit)]
    else:
        datasets = [_dataset_status(d, capacity, share, limit) for d in dirs]
    records = read_warm_records(root)
    for out in datasets:
        record = records.get(str(out["url"]).rstrip("/"))
        if record is not None:
            out["warm"] = record
            if share is not None:
                out["warm_mismatch"] = warm_mismatch(
                    record,
                    dataset_digest=record.get("dataset_digest"),  # the share's, not the data's
                    options=share.options,
                    topology=share.topology,
                    node_rank=share.node_rank,
                )
    used = sum(e.size for d in dirs for e in d.entries()) + sum(d.part_bytes() for d in dirs)
    return {
        "root": root,
        "capacity": capacity,
        "used_bytes": used,
        "counters": read_persisted(root),
        "datasets": datasets,
    }


def verify(root: str) -> dict[str, Any]:
    """Check every cached shard against its manifest checksum; remove the corrupt ones."""
    checked = 0
    corrupt: list[str] = []
    busy: list[str] = []
    for d in list_dataset_dirs(root):
        sweep_dead_parts(d)
        for e in d.entries():
            checked += 1
            info = cached_info(d.manifest, d.manifest.shards[e.shard])
            try:
                ok = os.path.getsize(e.path) == info.bytes and storage.file_checksum(e.path) == (
                    info.checksum
                )
            except FileNotFoundError:
                continue
            if not ok:
                corrupt.append(e.path)
                if remove_entry(d, e.shard) is None:
                    busy.append(e.path)
    return {"checked": checked, "corrupt": corrupt, "not_removed_in_use": busy}


def evict(root: str, *, url: str | None = None) -> dict[str, Any]:
    """Release the warm pins of one dataset (or all), then remove its cached shards that are
    neither pinned (``ShardCache.pin``) nor in use."""
    dirs = list_dataset_dirs(root)
    if url is not None:
        d = find_dataset_dir(root, url)
        if d is None:
            raise FileNotFoundError(f"dataset {url} is not in cache {root}")
        dirs = [d]
    counters = Counters(root)
    space = SpaceManager(
        root,
        capacity=_capacity(root) or 1,
        counters=counters,
        next_use=lambda key, shard: 0.0,
        timeout=0.0,
    )
    released = release_warm_pins(root, url)  # a warm's reservation ends with its eviction
    evicted, freed, kept = space.evict_all(dirs)
    counters.flush()
    return {
        "evicted": evicted,
        "bytes": freed,
        "kept_pinned_or_in_use": kept,
        "released_warm_pins": released,
    }
