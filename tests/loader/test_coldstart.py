"""Cold start from the real S3 server: read-ahead within its budget, samples served from
shards still arriving, a slow or failing store, ranks sharing one node cache.

The store sits behind ``slowproxy.SlowProxy`` (127.0.0.1), which counts every request and
can delay or cut them; nothing is faked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.errors import StorageError
from flashfeed.loader import Loader, read_ledger
from flashfeed.loader.passorder import make_pass_order
from flashfeed.loader.sources import CacheShardSource
from flashfeed.loader.telemetry.ledger import key_hash
from flashfeed.s3.retry import RetryPolicy

from support import SUPPORT
from support.loader_helpers import label_of, make_image_dataset

HERE = str(SUPPORT)
CLASSES = 10


def _dataset(prefix, proxy, sizes):
    make_image_dataset(prefix, sizes, classes=CLASSES)
    return Dataset.open(prefix, storage_options={"endpoint_url": proxy.endpoint})


def _cache(tmp_path, **kw):
    kw.setdefault("retry", RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, deadline=10))
    return ShardCache(str(tmp_path / "cache"), capacity=1 << 30, **kw)


def _planned_keys(loader, ds):
    plan = make_pass_order(
        loader.position.remaining(), loader.position.shard_sizes,
        batch_size=loader.batch_size, drop_last=loader.drop_last,
    )  # fmt: skip
    index = {s: ds.read_index(s) for s in set(plan.shards.tolist())}
    return plan, [
        f"{ds.shards[s].path}/{index[s][r].key}"
        for s, r in zip(plan.shards.tolist(), plan.rows.tolist(), strict=True)
    ]


def _shard_bytes_fetched(proxy, ds):
    """Bytes of each shard object the store was asked for (whole GETs count in full)."""
    got = {}
    for i, info in enumerate(ds.shards):
        reqs = [r for r in proxy.log(info.path) if r.method == "GET" and r.path.endswith(".tar")]
        got[i] = sum((r.range[1] - r.range[0]) if r.range else info.bytes for r in reqs)
    return got


def test_first_batch_is_served_before_its_shard_has_arrived(s3_prefix, proxy, tmp_path):
    proxy.delay = 0.05  # each request: a slow store; one part in flight at a time
    ds = _dataset(s3_prefix, proxy, [96, 96])
    cache = _cache(tmp_path, part_size="16KiB", concurrency=1)
    loader = Loader(
        ds, batch_size=8, image_size=16, cache=cache, shuffle=False, py_workers=1,
        ledger_dir=str(tmp_path / "ledger"),
    )  # fmt: skip
    plan, keys = _planned_keys(loader, ds)
    first = int(plan.shards[0])
    it = iter(loader)
    batch = next(it)
    # counters, not clocks: when batch 0 is in hand its shard is neither cached nor fully read
    assert not cache.contains(ds, first)
    assert _shard_bytes_fetched(proxy, ds)[first] < ds.shards[first].bytes
    labels = [label_of(k.rsplit("/", 1)[1], CLASSES) for k in keys]
    assert batch["label"].tolist() == labels[:8]
    got = batch["label"].tolist()
    for b in it:
        got += b["label"].tolist()
    assert got == labels
    stats = loader.stats()
    assert stats["readahead"]["batches_served_while_arriving"] >= 1
    assert stats["per_batch"][0]["waited_on_storage"] in (True, False)
    # every shard landed, verified, once; the second epoch asks the store for nothing
    assert all(cache.contains(ds, i) for i in range(len(ds.shards)))
    assert _shard_bytes_fetched(proxy, ds) == {i: s.bytes for i, s in enumerate(ds.shards)}
    before = len(proxy.requests)
    loader.set_epoch(1)
    assert sum(b["label"].numel() for b in loader) == 192
    assert len(proxy.requests) == before
    assert read_ledger(str(tmp_path / "ledger"))[0] == [key_hash(k) for k in keys]
    loader.close()
    cache.close()


class _Recording(CacheShardSource):
    """The cache source, recording every read-ahead request with the batch then in hand."""

    delivered = 0

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[int, list[int]]] = []

    def fetch_ahead(self, shards):
        self.calls.append((self.delivered, list(shards)))
        super().fetch_ahead(shards)


def test_readahead_never_exceeds_its_budget(s3_prefix, proxy, tmp_path):
    ds = _dataset(s3_prefix, proxy, [40] * 12)
    cache = _cache(tmp_path)
    source = _Recording(ds, cache)
    budget = int(2.5 * max(s.bytes for s in ds.shards))
    loader = Loader(
        ds, batch_size=8, image_size=16, source=source, py_workers=0, readahead_budget=budget,
        window=2,
    )  # fmt: skip
    plan, _ = _planned_keys(loader, ds)
    order, first_batch = plan.shard_order()
    need_at = dict(zip(order, first_batch, strict=True))
    lookahead = loader.prefetch + 1
    requested: set[int] = set()
    peak = 0
    n = 0
    for _ in loader:
        n += 1
        source.delivered = n
    for delivered, shards in source.calls:
        requested |= set(shards)
        # shards asked for ahead of need at that moment (batch `delivered` being made)
        ahead = [s for s in requested if need_at[s] > delivered + lookahead]
        peak = max(peak, sum(ds.shards[s].bytes for s in ahead))
    assert n == 480 // 8
    assert 0 < peak <= budget
    assert loader.stats()["readahead"]["max_bytes_ahead"] <= budget
    assert requested  # it did read ahead
    loader.close()
    cache.close()


def test_slow_store_delivers_every_sample_once_in_plan_order(s3_prefix, proxy, tmp_path):
    proxy.delay = 0.03
    ds = _dataset(s3_prefix, proxy, [50, 30, 45, 40, 35])
    cache = _cache(tmp_path, part_size="32KiB")
    loader = Loader(
        ds, batch_size=10, image_size=16, cache=cache, seed=5, py_workers=1,
        ledger_dir=str(tmp_path / "ledger"),
    )  # fmt: skip
    _, keys = _planned_keys(loader, ds)
    got = []
    for b in loader:
        got += b["label"].tolist()
    assert got == [label_of(k.rsplit("/", 1)[1], CLASSES) for k in keys]
    delivered = read_ledger(str(tmp_path / "ledger"))[0]
    assert delivered == [key_hash(k) for k in keys]
    assert len(set(delivered)) == len(delivered) == 200
    assert loader.stats()["batches_waited_on_storage"] >= 1
    loader.close()
    cache.close()


def test_storage_errors_mid_fetch_ahead_are_retried_then_named(s3_prefix, proxy, tmp_path):
    ds = _dataset(s3_prefix, proxy, [30, 30, 30, 30])
    victim = ds.shards[2].path
    cuts = defaultdict(int)

    def flaky(req):  # the first 3 answers for the victim's first part die midway
        if victim in req.path and req.range is not None and req.range[0] == 0 and cuts[0] < 3:
            cuts[0] += 1
            return True
        return False

    proxy.fail = flaky
    cache = _cache(tmp_path, part_size="16KiB")
    loader = Loader(ds, batch_size=10, image_size=16, cache=cache, seed=1, py_workers=0)
    assert sum(b["label"].numel() for b in loader) == 120
    assert cuts[0] == 3 and cache.stats()["retries"] == 3  # each cut retried, then it worked
    assert cache.contains(ds, 2)
    loader.close()
    cache.close()

    proxy.fail = lambda req: victim in req.path and req.range is not None and req.range[0] == 0
    cache = _cache(tmp_path / "again", part_size="16KiB")
    loader = Loader(ds, batch_size=10, image_size=16, cache=cache, seed=1, py_workers=0)
    with pytest.raises(StorageError, match=victim.replace(".", r"\.")):
        for _ in loader:
            pass
    assert not cache.contains(ds, 2)
    loader.close()
    cache.close()


def test_a_throttling_store_lowers_concurrency_and_still_delivers(s3_prefix, proxy, tmp_path):
    ds = _dataset(s3_prefix, proxy, [40] * 5)
    slowed = []

    def busy(req):  # the store answers SlowDown to the first dozen ranged GETs
        if req.range is not None and len(slowed) < 12:
            slowed.append(req)
            return True
        return False

    proxy.throttle = busy
    cache = _cache(tmp_path, part_size="16KiB", concurrency=8)
    loader = Loader(ds, batch_size=10, image_size=16, cache=cache, seed=2, py_workers=0)
    assert sum(b["label"].numel() for b in loader) == 200
    stats = cache.stats()
    assert len(slowed) == 12 and stats["throttle_events"] >= 1
    assert stats["concurrency_lowest"] < stats["concurrency_max"]
    assert all(cache.contains(ds, i) for i in range(len(ds.shards)))
    loader.close()
    cache.close()


def test_ranks_on_one_node_fetch_each_shard_once(s3_prefix, proxy, tmp_path):
    proxy.delay = 0.02
    ds = _dataset(s3_prefix, proxy, [40] * 6)
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
    procs, outs = [], []
    for rank in range(2):
        cfg = {
            "kind": "images", "url": s3_prefix, "cache_dir": str(tmp_path / "cache"),
            "batch_size": 8, "rank": rank, "world_size": 2, "epochs": 1,
            "ledger": str(tmp_path / "ledger"), "out": str(tmp_path / f"out{rank}.json"),
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "loader_rank_worker.py"), json.dumps(cfg)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
        outs.append(cfg["out"])
    for p in procs:
        log = p.communicate(timeout=180)[0].decode(errors="replace")
        assert p.returncode == 0, log[-3000:]
    seen = [json.load(open(o))["seen"] for o in outs]
    assert seen == [15, 15]
    # every byte of every shard was asked of the store exactly once by the two processes
    assert _shard_bytes_fetched(proxy, ds) == {i: s.bytes for i, s in enumerate(ds.shards)}
    idx = [r for r in proxy.requests if r.method == "GET" and r.path.endswith(".idx")]
    assert len(idx) == len(ds.shards)
    ledgers = read_ledger(str(tmp_path / "ledger"))
    assert len(set(np.concatenate(list(ledgers.values())).tolist())) == 240
