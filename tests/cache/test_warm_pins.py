"""Warm pins: two jobs read two datasets through one node cache that holds either alone but
not both. Job A's warmed share stays put while job B's fills evict only B's own shards (its
misses counted and reported); a dataset whose shard cannot fit beside the pins fails at
once as over capacity, and a warm of it says "over capacity", not "failed"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashfeed import Dataset
from flashfeed.cache import CacheOverCapacityError, ShardCache
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.cache.warm.warm import warm_share
from flashfeed.cli import main as cli_main
from flashfeed.loader import TokenLoader

from support.cache_data import make_dataset
from support.loader_helpers import make_token_dataset

_JOB = """
import json, sys
from flashfeed.loader import TokenLoader
loader = TokenLoader(sys.argv[1], batch_size=16, cache_dir=sys.argv[2], window=2,
                     readahead=0, seed=int(sys.argv[3]))
samples = 0
for epoch in range(3):
    for batch in loader:
        samples += len(batch["__key__"])
cache = loader.stats()["cache"]
print(json.dumps({"samples": samples, "hits": cache["hits"], "misses": cache["misses"],
                  "fetched": cache["bytes_fetched"]}))
loader.close()
"""


def _status(root: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli_main(["cache", "status", str(root), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_warmed_share_is_never_evicted_by_another_jobs_dataset(
    s3_prefix: str, tmp_path: Path, capsys
) -> None:
    a, b, c = f"{s3_prefix}/a", f"{s3_prefix}/b", f"{s3_prefix}/c"
    ma = make_token_dataset(a, [200] * 6, seq_len=64)
    mb = make_token_dataset(b, [200] * 6, seq_len=64)
    make_token_dataset(c, [2000], seq_len=64)  # one shard larger than the room left
    room_b = 4 * int(mb.shard_bytes.max())  # B's window and then some, not all of B
    capacity = ma.num_bytes + room_b + 1000
    assert capacity < ma.num_bytes + mb.num_bytes  # either alone fits, both do not
    root = tmp_path / "node"
    argv = ["cache", "warm", a, "--cache-dir", str(root), "--capacity", str(capacity)]
    assert cli_main([*argv, "--no-progress"]) == 0
    assert "6 fetched" in capsys.readouterr().out

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOB, url, str(root), seed],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for url, seed in ((a, "0"), (b, "1"))
    ]
    outs = [p.communicate(timeout=300) for p in jobs]
    assert [p.returncode for p in jobs] == [0, 0], [err[-2000:] for _, err in outs]
    job_a, job_b = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert job_a["samples"] == job_b["samples"] == 3 * 1200
    assert job_a["fetched"] == 0 and job_a["misses"] == 0  # A read only its warmed share
    assert job_b["misses"] > 6  # B did not fit: shards fetched again in later epochs
    assert job_b["fetched"] > mb.num_bytes

    report = _status(root, capsys)
    by_url = {d["url"]: d for d in report["datasets"]}
    assert by_url[a]["cached_shards"] == 6 and by_url[a]["warm_pinned"] == 6
    assert by_url[a]["pinned_bytes"] == by_url[a]["cached_bytes"]
    assert by_url[b]["cached_bytes"] <= room_b and by_url[b]["pinned"] == 0
    assert report["counters"]["misses"] >= job_b["misses"]  # reported node-wide
    assert report["counters"]["evictions"] > 0
    assert report["used_bytes"] <= capacity

    # a shard that cannot fit beside A's pins: refused at once, A untouched
    with pytest.raises(CacheOverCapacityError, match=f"over capacity: .*pinned.*of {a}"):
        for _ in TokenLoader(c, batch_size=16, cache_dir=str(root), readahead=0):
            pass
    with ShardCache(root) as cache:
        warmed = warm_share(cache, Dataset.open(c), NodeShare(), progress=False)
        assert warmed.over_capacity == 1 and warmed.failed == {} and warmed.fetched == 0
        assert cache.stats()["over_capacity"] >= 1
    assert _status(root, capsys)["datasets"][0]["cached_shards"] == 6

    # `cache evict` releases A's reservation: C now fits, evicting A
    assert cli_main(["cache", "evict", str(root), "--dataset", a]) == 0
    assert "released 6 warm pins" in capsys.readouterr().out
    keys = [
        k for batch in TokenLoader(c, batch_size=16, cache_dir=str(root)) for k in batch["__key__"]
    ]
    assert len(keys) == 2000


def test_a_share_without_room_is_reported_over_capacity_not_failed(
    s3_prefix: str, tmp_path: Path, capsys
) -> None:
    ds = make_dataset(f"{s3_prefix}/ds", shards=4, shard_bytes=40_000)
    other = make_dataset(f"{s3_prefix}/other", shards=2, shard_bytes=40_000, seed=1)
    capacity = sum(s.bytes + 200 for s in ds.shards)  # the share fits an empty cache
    root = tmp_path / "node"
    with ShardCache(root, capacity=capacity) as cache:
        for i in range(2):  # another dataset's shards, pinned: the room left holds two
            cache.get(other, i)
            cache.pin(other, i)
    argv = ["cache", "warm", ds.url, "--cache-dir", str(root), "--no-progress"]
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert "2 fetched, 0 already cached, 2 over capacity, 0 failed" in out
    assert "failed" not in err and "re-run" not in err
    with ShardCache(root) as cache:
        assert all(cache.contains(other, i) for i in range(2))  # the pins held
