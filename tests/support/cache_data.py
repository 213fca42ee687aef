"""Datasets for the cache tests: tar shards of seeded random bytes, with indexes."""

from __future__ import annotations

import os
import random

import numpy as np

from flashfeed import Dataset, Manifest, commit_manifest
from flashfeed.cli.devstore import EmbeddedStore, StoreError
from flashfeed.shardio import shard_name, write_tar_shard


def make_dataset(
    prefix: str, *, shards: int = 4, shard_bytes: int = 64 << 10, per_shard: int = 4, seed: int = 0
) -> Dataset:
    """A committed webdataset of ``shards`` shards of about ``shard_bytes`` each."""
    rng = np.random.default_rng(seed)
    infos = []
    for i in range(shards):
        samples = [
            (f"s{i:04d}-{j:04d}", {"bin": rng.bytes(max(1, shard_bytes // per_shard - 1024))})
            for j in range(per_shard)
        ]
        infos.append(write_tar_shard(prefix, shard_name(i, "tar"), samples))
    manifest = Manifest(
        name="cache-test",
        shard_format="webdataset",
        schema={"bin": "application/octet-stream"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, manifest)
    return Dataset.open(prefix)


def start_own_store(parent: str) -> EmbeddedStore:
    """A private SeaweedFS server in a fresh dir under ``parent`` on a random port.

    The default port 8333 is taken by whichever store started first on the machine, and a
    port found free can be taken before the server binds it: a few attempts cover that race.
    """
    last: Exception | None = None
    for attempt in range(4):
        store = EmbeddedStore(
            os.path.join(parent, f"store{attempt}"), port=random.randrange(20000, 45000)
        )
        try:
            store.start()
            return store
        except StoreError as exc:
            store.stop()
            last = exc
    raise RuntimeError(f"could not start a private SeaweedFS server: {last}")
