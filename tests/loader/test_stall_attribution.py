"""Stall attribution: a batch waits on storage only while bytes it needs have not arrived.

The store sits behind ``slowproxy.SlowProxy`` delaying only the GETs of shard bytes by a
known amount. One part per shard, one request in flight, no read-ahead beyond the batches
the pipeline may ask for, and decoding far faster than the delay: the store is the only
bottleneck, so the loader must report (about) one delay per shard as storage wait, and
nothing at all for a second epoch read from the cache.

"About": the consumer also waits for what the store and the fill do between the delays
(seconds of it on a loaded machine, milliseconds on a quiet one). So the reported wait is
checked within 20% against the span the proxy saw, from the first shard GET to the last
one's delay run out, and that span against the injected delays.
"""

from __future__ import annotations

import pytest

from benchmarks.harness.slowproxy import is_shard_get
from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.loader import Loader
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset

DELAY = 1.0
SHARDS = 4
PER_SHARD = 16


def test_storage_wait_is_the_injected_delay_and_a_hot_epoch_has_none(s3_prefix, proxy, tmp_path):
    make_image_dataset(s3_prefix, [PER_SHARD] * SHARDS, classes=4, size=16)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    cache = ShardCache(
        str(tmp_path / "cache"), capacity=1 << 30, part_size="4MiB", concurrency=1,
        retry=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.05, deadline=10),
    )  # fmt: skip
    assert all(s.bytes <= cache.fetcher.part_size for s in ds.shards)  # one GET per shard
    # the process's first fill also sets up its S3 client (a fixed cost, not a delay of the
    # store): pay it on another dataset, undelayed, before the measured epoch
    make_image_dataset(f"{s3_prefix}-warmup", [4], classes=4, size=16)
    cache.get(Dataset.open(f"{s3_prefix}-warmup", storage_options=ds.storage_options), 0)
    proxy.requests.clear()
    proxy.delay, proxy.delay_if = DELAY, is_shard_get
    loader = Loader(
        ds, batch_size=PER_SHARD, image_size=16, cache=cache, shuffle=False, py_workers=0,
        readahead=0,
    )  # fmt: skip
    assert sum(b["label"].numel() for b in loader) == SHARDS * PER_SHARD
    cold = loader.stats()
    shard_gets = [r for r in proxy.requests if is_shard_get(r)]
    assert len(shard_gets) == SHARDS
    # the store served one delayed GET at a time and the consumer had nothing else to
    # wait for: its storage wait is the span of those GETs, which the delays fill
    span = shard_gets[-1].at + DELAY - shard_gets[0].at
    assert span >= SHARDS * DELAY
    assert cold["wait_s"]["storage"] == pytest.approx(span, rel=0.2)
    print(
        f"storage wait {cold['wait_s']['storage']:.2f} s, store span {span:.2f} s, "
        f"injected {SHARDS * DELAY:.2f} s"
    )
    assert cold["batches_waited_on_storage"] >= 1

    loader.set_epoch(1)
    assert sum(b["label"].numel() for b in loader) == SHARDS * PER_SHARD
    hot = loader.stats()
    assert len([r for r in proxy.requests if is_shard_get(r)]) == SHARDS  # all from the cache
    assert hot["wait_s"]["storage"] == cold["wait_s"]["storage"]
    assert hot["batches_waited_on_storage"] == cold["batches_waited_on_storage"]
    epoch1 = [b for b in hot["per_batch"] if b["epoch"] == 1]
    assert len(epoch1) == SHARDS and all(b["storage_s"] == 0 for b in epoch1)
    loader.close()

    # a new loader on the warm cache (a restart): its first epoch waits on nothing either
    again = Loader(
        ds, batch_size=PER_SHARD, image_size=16, cache=cache, shuffle=False, py_workers=0,
    )  # fmt: skip
    assert sum(b["label"].numel() for b in again) == SHARDS * PER_SHARD
    restarted = again.stats()
    assert restarted["wait_s"]["storage"] == 0
    assert restarted["batches_waited_on_storage"] == 0
    again.close()
    cache.close()
