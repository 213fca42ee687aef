"""The node service's fill queue, as the store sees it: a read of a shard being filled
holds no fill worker, a fetch ahead is one fill per shard behind the job's reads, a fetch
ahead from a process gone is dropped, and a loader's read-ahead stays inside its quota and
skips the shards it holds. The bandwidth shares themselves are measured in
``benchmarks/stages/nodequota.py``, not here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flashfeed.cache.node import NodeClient, NodeShardSource
from flashfeed.dataset import Dataset
from flashfeed.loader.readahead import readahead_budget_bytes
from flashfeed.runtime.fdpath import map_readonly

DELAY = 1.5  # seconds every shard GET waits at the proxy: fills stay in flight


def _gets(proxy: Any, since: int, url: str) -> list[tuple[int, float]]:
    """(shard, when) of the store GETs of ``url``'s tar shards after request ``since``."""
    prefix = "/" + url.split("://", 1)[1] + "/shards/"
    out = []
    for r in proxy.requests[since:]:
        if r.method == "GET" and r.path.startswith(prefix) and r.path.endswith(".tar"):
            out.append((int(r.path.rsplit("/", 1)[1].split(".")[0]), r.at))
    return out


@contextmanager
def _slow_store(
    node: Any, node_store: dict[str, Any], url: str
) -> Iterator[tuple[NodeClient, Any]]:
    """A started service (root's quota 16 MiB), a client that opened ``url``, and a store
    whose shard GETs take ``DELAY`` from now: ``(client, gets)``, ``gets()`` the store GETs
    of ``url`` since. Closed, and the store fast again, at the end."""
    node.write_config(tenants={"root": {"quota": "16MiB"}})
    node.start()
    proxy = node_store["proxy"]
    client = NodeClient(node.socket, storage_options=node_store["admin"], reconnect_timeout=5)
    client.open(url)
    since = len(proxy.requests)
    proxy.delay = DELAY
    try:
        yield client, lambda: _gets(proxy, since, url)
    finally:
        proxy.delay = 0.0
        client.close()


def _close(got: tuple[int, int | None, bool]) -> None:
    for fd in got[:2]:
        if fd is not None:
            os.close(fd)


def test_reads_of_a_shard_being_filled_hold_no_fill_worker(node, node_store, datasets):
    url = datasets["shared"]
    with _slow_store(node, node_store, url) as (client, store_gets):
        # shard 0 is filled once and read by five threads; the service has four fill
        # workers: waiting in them, the reads would keep shard 1's fill queued meanwhile
        readers = [threading.Thread(target=lambda: _close(client.get(url, 0))) for _ in range(5)]
        for t in readers:
            t.start()
            time.sleep(0.05)
        _close(client.get(url, 1))
        for t in readers:
            t.join(30)
    gets = store_gets()
    assert sorted(s for s, _ in gets) == [0, 1], gets  # each shard read from the store once
    at = dict(gets)
    assert at[1] - at[0] < DELAY / 2, gets  # shard 1 went out while shard 0's fill waited


def test_a_fetch_ahead_is_one_fill_per_shard_behind_the_jobs_reads(node, node_store, datasets):
    url = datasets["shared"]
    with _slow_store(node, node_store, url) as (client, store_gets):
        # the four fill workers busy, the first freed 0.4 s before the others
        client.prefetch(url, [0])
        time.sleep(0.4)
        client.prefetch(url, [1, 2])  # one hint, two fills side by side
        time.sleep(0.2)
        client.prefetch(url, [3])
        time.sleep(0.2)
        client.prefetch(url, [4])  # queued
        time.sleep(0.1)
        _close(client.get(url, 5))  # a read asked for later goes before it
        deadline = time.monotonic() + 30
        while len(store_gets()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    gets = store_gets()
    order = [s for s, _ in sorted(gets, key=lambda g: g[1])]
    assert sorted(order) == [0, 1, 2, 3, 4, 5], gets
    assert order[4:] == [5, 4], gets
    at = dict(gets)
    assert abs(at[2] - at[1]) < DELAY / 4, gets


def test_a_fetch_ahead_of_a_process_gone_is_dropped(node, node_store, datasets):
    url = datasets["shared"]
    with _slow_store(node, node_store, url) as (client, store_gets):
        client.prefetch(url, [0, 1, 2, 3, 4, 5])  # four start, two queue
        time.sleep(0.3)
        client.close()  # the process that asked is gone before the two queued start
        time.sleep(2 * DELAY + 0.5)
    assert sorted(s for s, _ in store_gets()) == [0, 1, 2, 3]


def test_a_loaders_read_ahead_fits_its_quota_and_skips_the_shards_it_holds(
    node, node_store, datasets
):
    node.write_config(tenants={"root": {"quota": "6MiB"}})
    node.start()
    url, proxy = datasets["shared"], node_store["proxy"]
    source = NodeShardSource(
        Dataset.open(url, storage_options=node_store["admin"]),
        socket_path=node.socket,
        storage_options=node_store["admin"],
    )
    try:
        assert source.capacity == 6 << 20  # the tenant's quota: what it may hold here
        assert readahead_budget_bytes(None, source) == 3 << 20  # half, as of a cache's capacity
        source.local_path(0)  # held: its descriptor reads on after an eviction
        assert source.client.evict(url)["evicted"] == 1
        since = len(proxy.requests)
        source.fetch_ahead([0, 1])
        deadline = time.monotonic() + 30
        while not _gets(proxy, since, url) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert [s for s, _ in _gets(proxy, since, url)] == [1]
    finally:
        source.close()


def test_a_source_holding_fewer_descriptors_than_shards_still_reads_most_without_asking(
    node, node_store, datasets
):
    """An epoch reads every shard once: with the oldest let go first, a source that may
    hold 4 of 6 shards let go of each just before its read, and asked the service for every
    one. Letting go of the one held last before the new one keeps most for the next pass."""
    node.write_config(tenants={"root": {"quota": "16MiB"}})
    node.start()
    url = datasets["shared"]
    source = NodeShardSource(
        Dataset.open(url, storage_options=node_store["admin"]),
        socket_path=node.socket,
        storage_options=node_store["admin"],
        max_held=4,
    )
    try:
        for _ in range(4):
            for s in range(6):
                source.local_path(s)
        stats = source.stats()
        assert stats["held"] == 4
        assert stats["held_reads"] == 10, stats  # 4, 2, 4 after the first pass; LRU: none
        assert stats["held_reads"] + stats["hits"] + stats["misses"] == 24
    finally:
        source.close()


def test_the_paths_handed_out_last_stay_valid_while_more_are_handed_out(node, node_store, datasets):
    """A reader may open a path a moment after it got it: the source never lets go of the
    descriptors it handed out last (a quarter of ``max_held``) for a new one."""
    node.write_config(tenants={"root": {"quota": "16MiB"}})
    node.start()
    ds = Dataset.open(datasets["shared"], storage_options=node_store["admin"])
    source = NodeShardSource(
        ds, socket_path=node.socket, storage_options=node_store["admin"], max_held=4
    )
    try:
        for s in range(4):
            source.local_path(s)
        path = source.local_path(4)  # not opened before the next one is handed out
        source.local_path(5)
        with map_readonly(path) as m:
            assert m[:] == ds.read_shard(4)
    finally:
        source.close()


def test_the_descriptors_a_source_keeps_follow_the_open_file_limit(monkeypatch):
    from flashfeed.cache.node import source as node_source

    for soft, held in ((1024, 256), (20_000, 5_000), (100, 50), (1 << 30, 16_384)):
        monkeypatch.setattr(node_source.resource, "getrlimit", lambda _, s=soft: (s, s))
        assert node_source.default_max_held() == held
