"""Datasets for the cache tests: tar shards of seeded random bytes, with indexes; and a
fault that lands mid-work (``kill_when``)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.harness.datasets import random_dataset
from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import Dataset
from flashfeed.cache.peer.client import PeerTier
from flashfeed.cli.devstore import EmbeddedStore, StoreError

#: the cluster token of the cluster tier's tests (``tests/cache/conftest.py``)
PEER_TOKEN = b"cluster-token-of-this-test-0123456789"


def make_dataset(
    prefix: str, *, shards: int = 4, shard_bytes: int = 64 << 10, per_shard: int = 4, seed: int = 0
) -> Dataset:
    """A committed webdataset of ``shards`` shards of about ``shard_bytes`` each."""
    return random_dataset(prefix, shards, shard_bytes, per_shard=per_shard, seed=seed)


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


def kill_when(node: Any, ready: Callable[[], bool], *, timeout: float = 20.0) -> threading.Thread:
    """A started thread that SIGKILLs ``node`` (a simulated node) as soon as ``ready()``
    says so (or after ``timeout`` seconds): a fault that lands in the middle of some work."""

    def run() -> None:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        node.kill()

    killer = threading.Thread(target=run)
    killer.start()
    return killer


@contextmanager
def behind_a_link(node: Any) -> Iterator[tuple[SlowProxy, PeerTier]]:
    """``(link, tier)``: a tier whose one peer, ``node`` (a simulated node), it reaches only
    through a proxy of its own, the link (its ``delay`` makes a partition); requests time
    out after 1 s, announcements are trusted 30 s."""
    host, port = node.address.rsplit(":", 1)
    link = SlowProxy((host, int(port)))
    try:
        tier = PeerTier(
            peers=[f"127.0.0.1:{link.port}"], token=PEER_TOKEN, timeout=1.0, announce_ttl=30.0
        )
        yield link, tier
    finally:
        link.close()
