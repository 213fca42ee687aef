"""Loaders reading a dataset on the real S3 server through the node cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from flashfeed.cache import ShardCache
from flashfeed.cache.stats import read_persisted
from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader, TokenLoader, read_ledger

from support import SUPPORT
from support.loader_helpers import make_image_dataset, make_token_dataset, resume_scenario

HERE = str(SUPPORT)


def _ranks(tmp_path, cfgs):
    """Run one process per config at once; return their outputs."""
    procs = []
    for i, cfg in enumerate(cfgs):
        cfg["out"] = str(tmp_path / f"out-{cfg['rank']}-{cfg['world_size']}-{i}.json")
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "loader_rank_worker.py"), json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outs = []
    for p, cfg in zip(procs, cfgs, strict=True):
        log = p.communicate(timeout=240)[0].decode(errors="replace")
        assert p.returncode == 0, log[-3000:]
        with open(cfg["out"]) as f:
            outs.append(json.load(f))
    return outs


@pytest.mark.parametrize("kind", ["images", "tokens"])
def test_rank_processes_share_one_cache_and_resume_on_more_ranks(s3_prefix, tmp_path, kind):
    if kind == "images":
        make_image_dataset(s3_prefix, [24, 24, 24, 24, 24], size=16)  # 120 samples
    else:
        make_token_dataset(s3_prefix, [24, 24, 24, 24, 24], seq_len=8)
    cache_dir, ledger = str(tmp_path / "cache"), str(tmp_path / "ledger")
    base = {"url": s3_prefix, "cache_dir": cache_dir, "ledger": ledger, "kind": kind}
    base.update(batch_size=4, epochs=2)
    # two ranks stop after 6 batches of epoch 0; three ranks resume and finish both epochs
    first = _ranks(tmp_path, [{**base, "rank": r, "world_size": 2, "stop": 6} for r in range(2)])
    state = first[0]["state"]
    assert state == first[1]["state"] and state["samples_consumed"] == 48
    _ranks(tmp_path, [{**base, "rank": r, "world_size": 3, "state": state} for r in range(3)])
    ledger_by_epoch = read_ledger(ledger)
    for epoch in (0, 1):
        counts = Counter(ledger_by_epoch[epoch])
        assert len(counts) == 120 and max(counts.values()) == 1, epoch
    # one download per shard for the whole node, however many processes read it: the node's
    # counters (every process of the node, reader processes included, adds to them)
    node = read_persisted(cache_dir)
    assert node["misses"] == 5
    assert node["bytes_fetched"] == Dataset.open(s3_prefix).manifest.num_bytes


def test_a_cache_smaller_than_the_dataset_still_delivers_everything(s3_prefix, tmp_path):
    make_image_dataset(s3_prefix, [30, 30, 30, 30, 30, 30], size=16)
    ds = Dataset.open(s3_prefix)
    biggest = max(s.bytes for s in ds.shards)
    cache = ShardCache(str(tmp_path / "cache"), capacity=int(biggest * 3.5))

    def make(rank, world, ledger_dir):
        return Loader(
            ds, batch_size=5, image_size=16, rank=rank, world_size=world, seed=1,
            cache=cache, ledger_dir=ledger_dir, py_workers=1, window=2,
        )  # fmt: skip

    full, resumed = resume_scenario(make, tmp_path, before=1, after=2, stop=14)
    for ledger in (full, resumed):
        for hashes in ledger.values():
            assert len(hashes) == 180 and max(Counter(hashes).values()) == 1
    s = cache.stats()
    assert s["evictions"] > 0 and s["misses"] > 6 and s["used_bytes"] <= s["capacity"]


def test_missing_shard_on_the_store_is_named(s3_prefix, tmp_path):
    from flashfeed import storage

    make_token_dataset(s3_prefix, [10, 10, 10], seq_len=4)
    storage.delete(storage.join(s3_prefix, "shards/000001.arrow"))
    cache = ShardCache(str(tmp_path / "cache"), capacity=1 << 24)
    loader = TokenLoader(s3_prefix, batch_size=5, cache=cache, shuffle=False, readahead=0)
    with pytest.raises(CorruptShardError, match=r"shards/000001\.arrow"):
        for _ in loader:
            pass


def test_loader_stats_show_cache_hits_on_the_second_epoch(s3_prefix, tmp_path):
    make_image_dataset(s3_prefix, [16, 16], size=16)
    cache_dir = tmp_path / "cache"
    loader = Loader(s3_prefix, batch_size=8, image_size=16, cache_dir=str(cache_dir))
    for _ in range(2):
        for _ in loader:
            pass
    s = loader.stats()
    assert s["batches"] == 8 and s["cache"]["misses"] == 2 and s["cache"]["hits"] >= 2
    assert len(list(cache_dir.rglob("*.tar"))) == 2
