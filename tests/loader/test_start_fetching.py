"""``start_fetching()``: a job starts the download its first batches wait for, then builds
its model while the bytes arrive.

The store sits behind ``slowproxy.SlowProxy`` delaying each GET of shard bytes by a known
amount. A loader that starts fetching only at ``iter()`` waits for that delay at its first
batch; one whose fetches started before the loop, while the job did other things, waits for
nothing, reads every shard once, and delivers the very batches of the plan.
"""

from __future__ import annotations

import threading

import pytest

from benchmarks.harness.slowproxy import is_shard_get
from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.loader import Loader, ShardDataset, TokenLoader, base
from flashfeed.loader.readahead import StreamFeeder
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset, make_token_dataset
from support.monitor_helpers import wait_for

DELAY = 1.0
SHARDS = 4
PER_SHARD = 16


def _cache(path) -> ShardCache:
    retry = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.05, deadline=10)
    return ShardCache(str(path), capacity=1 << 30, part_size="4MiB", concurrency=SHARDS,
                      retry=retry)  # fmt: skip


def _loader(ds: Dataset, cache: ShardCache) -> Loader:
    return Loader(ds, batch_size=PER_SHARD, image_size=16, cache=cache, py_workers=0, seed=5)


def _keys(loader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


def test_fetches_started_before_the_loop_spare_the_first_batch_its_wait(
    s3_prefix, proxy, tmp_path, monkeypatch
):
    make_image_dataset(s3_prefix, [PER_SHARD] * SHARDS, classes=4, size=16)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    # the process's first fill also sets up its S3 client: pay that undelayed, beforehand
    make_image_dataset(f"{s3_prefix}-warmup", [4], classes=4, size=16)
    warm = _cache(tmp_path / "warmup")
    warm.get(Dataset.open(f"{s3_prefix}-warmup", storage_options=ds.storage_options), 0)
    warm.close()
    proxy.delay, proxy.delay_if = DELAY, is_shard_get

    # a loader that starts fetching at iter(): its first batch waits for the store
    cold = _loader(ds, _cache(tmp_path / "cold"))
    expected = _keys(cold)
    waited = cold.stats()
    cold.close()
    assert waited["wait_s"]["storage"] >= 0.8 * DELAY
    assert waited["batches_waited_on_storage"] >= 1

    proxy.requests.clear()
    feeders = []
    monkeypatch.setattr(
        base, "StreamFeeder", lambda *a, **kw: feeders.append(StreamFeeder(*a, **kw)) or feeders[-1]
    )
    cache = _cache(tmp_path / "early")
    loader = _loader(ds, cache)
    assert loader.start_fetching() == SHARDS  # the plan's window: every shard here
    # the job builds its model meanwhile; the shards land without the loop running
    wait_for(
        "the shards asked for before the loop to be cached",
        lambda: all(cache.ready_path(ds, i) is not None for i in range(SHARDS)),
        timeout=30.0,
    )
    assert len([r for r in proxy.requests if is_shard_get(r)]) == SHARDS
    got = _keys(loader)
    stats = loader.stats()
    loader.close()
    assert got == expected  # the plan's batches, in order
    assert stats["wait_s"]["storage"] == 0.0
    assert stats["batches_waited_on_storage"] == 0
    assert len([r for r in proxy.requests if is_shard_get(r)]) == SHARDS  # each shard once
    assert len(feeders) == 1  # the pass took over the feeder that started the fetches


def test_a_position_loaded_after_start_fetching_is_read_exactly(s3_prefix, tmp_path):
    make_image_dataset(s3_prefix, [PER_SHARD] * SHARDS, classes=4, size=16)
    ds = Dataset.open(s3_prefix)
    ref = _loader(ds, _cache(tmp_path / "ref"))
    it = iter(ref)
    next(it)
    state = ref.state_dict()  # after batch 0
    rest = [k for batch in it for k in batch["__key__"]]
    ref.close()

    loader = _loader(ds, _cache(tmp_path / "resumed"))
    assert loader.start_fetching() > 0  # for the epoch's start, which is then not read
    loader.load_state_dict(state)
    assert _keys(loader) == rest
    assert loader.start_fetching() > 0  # the next epoch's first window
    loader.set_epoch(3)  # another epoch after all: its own order is read
    got = _keys(loader)
    loader.close()
    check = _loader(ds, _cache(tmp_path / "check"))
    check.set_epoch(3)
    assert got == _keys(check)
    check.close()


def test_token_loader_takes_over_its_early_fetches(s3_prefix, tmp_path):
    make_token_dataset(s3_prefix, [40, 24, 36, 30], seq_len=8)
    ds = Dataset.open(s3_prefix)
    expected = TokenLoader(ds, batch_size=6, cache=_cache(tmp_path / "ref"), seed=3, window=2)
    want = [b["__key__"] for b in expected]
    expected.close()
    loader = TokenLoader(ds, batch_size=6, cache=_cache(tmp_path / "early"), seed=3, window=2)
    assert loader.start_fetching() > 0
    assert [b["__key__"] for b in loader] == want
    loader.close()


def test_shard_dataset_workers_read_what_the_trainer_started_fetching(s3_prefix, proxy, tmp_path):
    make_image_dataset(s3_prefix, [PER_SHARD] * SHARDS, classes=4, size=16)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    dataset = ShardDataset(ds, batch_size=8, cache=_cache(tmp_path / "cache"), seed=2)
    proxy.delay, proxy.delay_if = 0.5, is_shard_get
    assert dataset.start_fetching() == SHARDS
    # the workers fork while the trainer's fills are under way; theirs join those fills
    got = [k for batch in dataset.loader(num_workers=2) for k in batch["__key__"]]
    assert sorted(got) == sorted(f"{s.path}/{e.key}" for s in ds.shards for e in ds.read_index(s))
    dataset.close()


def test_nothing_to_fetch_in_place_and_no_early_fetch_during_a_pass(tmp_path):
    make_image_dataset(str(tmp_path / "ds"), [PER_SHARD] * 2, classes=4, size=16)
    loader = Loader(str(tmp_path / "ds"), batch_size=PER_SHARD, image_size=16, py_workers=0)
    assert loader.start_fetching() == 0  # read in place: nothing to download
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="already being iterated"):
        loader.start_fetching()
    it.close()
    loader.close()


def test_a_loader_closed_before_its_loop_leaves_no_fetch_threads(s3_prefix, tmp_path):
    make_image_dataset(s3_prefix, [PER_SHARD] * SHARDS, classes=4, size=16)

    def fetch_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("ff-need")}

    before = fetch_threads()
    cache = _cache(tmp_path / "cache")
    loader = _loader(Dataset.open(s3_prefix), cache)
    assert loader.start_fetching() == SHARDS
    assert fetch_threads() - before  # the fetches run in threads of their own
    loader.close()
    cache.close()
    wait_for(
        "the early fetches' threads to end", lambda: not fetch_threads() - before, timeout=30.0
    )
