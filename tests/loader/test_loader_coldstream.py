"""The first epoch from the real S3 server, empty cache, for ``TokenLoader`` and
``ShardDataset``: every sample exactly once, equal to the bytes of its shard on the store,
and served while its shard is still arriving.

The store sits behind ``slowproxy.SlowProxy``, which delays each request; nothing is faked.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from flashfeed import storage
from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.format.arrowshard import open_arrow
from flashfeed.loader import ShardDataset, TokenLoader, read_ledger
from flashfeed.loader.telemetry.ledger import key_hash
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset, make_token_dataset


def _cold(prefix, proxy, tmp_path, *, delay, **cache_kw):
    """The dataset at ``prefix`` read through the delaying proxy, an empty node cache and a
    ledger directory."""
    proxy.delay = delay
    ds = Dataset.open(prefix, storage_options={"endpoint_url": proxy.endpoint})
    retry = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, deadline=10)
    cache = ShardCache(str(tmp_path / "cache"), capacity=1 << 30, retry=retry, **cache_kw)
    return ds, cache, str(tmp_path / "ledger")


def _store_bytes(ds: Dataset, shard: int) -> bytes:
    """The shard as the store holds it (read past the proxy and the cache)."""
    return storage.read_bytes(ds.shard_url(shard), storage_options=None)


def test_token_loader_cold_epoch_delivers_the_store_rows_once(s3_prefix, proxy, tmp_path):
    make_token_dataset(s3_prefix, [40, 24, 36, 30], seq_len=8)
    ds, cache, ledger = _cold(s3_prefix, proxy, tmp_path, delay=0.02, part_size="16KiB")
    loader = TokenLoader(ds, batch_size=6, cache=cache, seed=3, window=2, ledger_dir=ledger)
    expected = {}
    for i in range(len(ds.shards)):
        table = open_arrow(_store_bytes(ds, i), name=ds.shards[i].path)
        keys = table.column("__key__").to_pylist()
        rows = np.asarray(table.column("tokens").to_pylist(), dtype=np.int64)
        expected.update({f"{ds.shards[i].path}/{k}": r for k, r in zip(keys, rows, strict=True)})
    got: list[str] = []
    for batch in loader:
        for key, row in zip(batch["__key__"], batch["tokens"].numpy(), strict=True):
            assert row.tolist() == expected[key].tolist(), key
            got.append(key)
    assert len(got) == (130 // 6) * 6  # drop_last: the plan's last partial batch is dropped
    assert max(Counter(got).values()) == 1
    assert read_ledger(ledger)[0] == [key_hash(k) for k in got]
    # rows served while their shard arrived: test_token_stream.py
    assert all(cache.contains(ds, i) for i in range(len(ds.shards)))
    loader.close()
    cache.close()


def test_shard_dataset_cold_epoch_streams_the_store_bytes_once(s3_prefix, proxy, tmp_path):
    make_image_dataset(s3_prefix, [48, 48, 40], size=16)
    # a slow store, one part in flight at a time: shards arrive slowly
    ds, cache, ledger = _cold(
        s3_prefix, proxy, tmp_path, delay=0.05, part_size="16KiB", concurrency=1
    )
    dataset = ShardDataset(ds, batch_size=4, cache=cache, shuffle=False, ledger_dir=ledger)
    stored = {i: _store_bytes(ds, i) for i in range(len(ds.shards))}
    entries = {f"{ds.shards[i].path}/{e.key}": (i, e) for i in stored for e in ds.read_index(i)}
    got: list[str] = []
    for sample in dataset:
        shard, entry = entries[sample["__key__"]]
        for c in entry.components:
            if c.ext != "cls":  # labels come parsed; every other member as its bytes
                assert sample[c.ext] == stored[shard][c.offset : c.offset + c.size]
            else:
                assert sample["cls"] == int(stored[shard][c.offset : c.offset + c.size])
        got.append(sample["__key__"])
    assert got == sorted(entries, key=lambda k: (entries[k][0], entries[k][1].start))
    assert read_ledger(ledger)[0] == [key_hash(k) for k in got]
    readahead = dataset.stats()["readahead"]
    assert readahead["batches_served_while_arriving"] >= 1
    assert all(cache.contains(ds, i) for i in range(len(ds.shards)))
    dataset.close()
    cache.close()


def test_shard_dataset_workers_stream_a_cold_epoch_once(s3_prefix, proxy, tmp_path):
    make_image_dataset(s3_prefix, [30, 30, 30, 30], size=16)
    ds, cache, ledger = _cold(s3_prefix, proxy, tmp_path, delay=0.02, part_size="16KiB")
    dataset = ShardDataset(ds, batch_size=5, cache=cache, seed=2, ledger_dir=ledger)
    stored = {i: _store_bytes(ds, i) for i in range(len(ds.shards))}
    jpg = {
        f"{ds.shards[i].path}/{e.key}": stored[i][c.offset : c.offset + c.size]
        for i in stored
        for e in ds.read_index(i)
        for c in e.components
        if c.ext == "jpg"
    }
    got: list[str] = []
    for batch in dataset.loader(num_workers=2):
        for key, data in zip(batch["__key__"], batch["jpg"], strict=True):
            assert data == jpg[key], key
            got.append(key)
    assert sorted(got) == sorted(jpg)  # 120 samples, batch 5, one rank: nothing dropped
    assert read_ledger(ledger)[0] == [key_hash(k) for k in got]
    assert all(cache.contains(ds, i) for i in range(len(ds.shards)))
    cache.close()
